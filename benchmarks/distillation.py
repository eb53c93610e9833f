"""QDagger's offline phase alone: how close a student gets to its teacher before any env step, per setting.

For each teacher (the run directory of a finished `rlfleet up --algo dqn` run) and each variant (a set of
overrides of the QDagger preset for the teacher's env; "" is the preset itself), a QDagger student
(`rlfleet.algorithms.qdagger.agent.QDaggerAgent`, λ at its base value) takes --steps gradient steps on the teacher's
replay, served by an in-process Reverb server from a read-only copy of the teacher's checkpoint
(`open_teacher_replay`, as `rlfleet replay --teacher` serves it), and is evaluated every --every gradient steps
(--episodes episodes, the learner's ε-greedy evaluation policy, each evaluation on new env seeds; a QDagger
run evaluates on the same seeds each time). Baseline in the same run: the teacher's own evaluation R_T (and a
random policy's), measured as a QDagger run measures them at its start (`QDaggerAgent.on_start`). No env
step is taken for the student's training: this is what the online phase of `rlfleet up --algo qdagger` starts
from. A variant "distillation_base=0;learning_rate_final=X" (X: the preset's learning_rate) is the control:
the same offline TD steps on the teacher's replay without the distillation term.

Prints one row per teacher and variant: R_T, the evaluation returns and how many of them reached 0.9 of the
way from the random policy's return R_rand to R_T.

Usage:
    python benchmarks/distillation.py --teacher runs/t0 --teacher runs/t1 \
        --variant "" --variant distillation_temperature=0.1 --variant distillation_temperature=1.0 [--out F]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import tempfile
import time

import numpy as np


def parse_variant(text: str) -> dict:
    """ "k=v;k=v" (values as JSON, else strings) -> {k: v}; "" -> {} (the preset).

    Raises:
        ValueError: an item without "=".
    """
    from rlfleet.deploy.cli import parse_override

    try:
        return dict(parse_override(item) for item in filter(None, (s.strip() for s in text.split(";"))))
    except ValueError as e:
        raise ValueError(f"variant item {e}, e.g. distillation_temperature=1.0") from None


def distil(teacher_dir: str, overrides: dict, steps: int, every: int, episodes: int, seed: int) -> dict:
    """One student's offline phase against the teacher in `teacher_dir`: the QDagger preset of the teacher's
    env with `overrides`, `steps` gradient steps, an evaluation of `episodes` episodes after every `every` of
    them. `seed` initialises the student's network; evaluation k (after k·`every` steps) plays env seeds
    `evaluation_seed(seed)` + k·`episodes` + i, new episodes each time, away from the actors' seeds.

    Returns:
        dict: teacher, env_id, overrides, settings (the student's resolved config), teacher_return (R_T) and
        random_return (the QDagger run's own measurements at start, mean undiscounted returns), evals
        [(gradient steps, mean undiscounted return)], seconds (wall time of the steps and evaluations).
    Raises:
        TeacherError (a ValueError): `teacher_dir` is not a usable teacher (the message says why);
        ValueError: `every` is not in 1..`steps`, or an override the preset does not have;
        FloatingPointError: a non-finite loss.
    """
    import reverb

    from rlfleet.algorithms.dqn.agent import passed_multiple
    from rlfleet.algorithms.library.evaluation import evaluation_seed
    from rlfleet.algorithms.qdagger.agent import make_agent
    from rlfleet.algorithms.qdagger.teacher import check_teacher_dir
    from rlfleet.algorithms.settings import make_algo_config
    from rlfleet.envs.core import env_spec
    from rlfleet.replay.checkpoints import REPLAY_SUBDIR, checkpointer, open_teacher_replay
    from rlfleet.replay.server import tables_for

    if not 1 <= every <= steps:
        raise ValueError(f"every={every}: evaluate every 1..steps ({steps}) gradient steps")
    env_id = _teacher_env(teacher_dir)
    spec = env_spec(env_id) if env_id else None
    check_teacher_dir(teacher_dir, spec)  # without run.json (spec None) it raises before looking at spec
    # All steps offline: the student never waits on a replay of its own.
    config = make_algo_config("qdagger", "default", env_id, dict(overrides, offline_steps=steps))
    # Calls of gradient steps that divide `every`, so that each evaluation falls on its step.
    config.gradient_steps_per_call = math.gcd(every, config.gradient_steps_per_call)
    work = tempfile.mkdtemp(prefix="rlfleet-distil-")
    server = batches = None
    try:
        copy = open_teacher_replay(os.path.join(teacher_dir, REPLAY_SUBDIR), work)
        restoring = checkpointer(work, restore_from=copy)
        server = reverb.Server(tables_for("qdagger", spec, config), port=None, checkpointer=restoring)
        agent = make_agent(spec, config, seed, teacher=teacher_dir, teacher_replay=f"localhost:{server.port}")
        agent.on_start()  # R_T and the random policy's return, as a QDagger run measures them
        batches = agent.samples("")
        evals, start = [], time.monotonic()
        step = 0
        while step < steps:  # `samples` ends the offline phase on its step: `step` reaches `steps` exactly
            result = agent.consume(next(batches), 0, 0)
            step += result.gradient_steps
            for name in ("td_loss", "distillation_loss"):
                if name in result.metrics and not np.isfinite(result.metrics[name]):
                    raise FloatingPointError(f"{name} is {result.metrics[name]} by gradient step {step}")
            if passed_multiple(step, result.gradient_steps, every):
                first = evaluation_seed(seed) + (step // every) * episodes
                evals.append((step, float(np.mean(agent.evaluate(episodes, first)))))
        seconds = time.monotonic() - start
    finally:
        if batches is not None:
            batches.close()  # the Reverb dataset before its server
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    return dict(
        teacher=teacher_dir,
        env_id=env_id,
        overrides=overrides,
        settings=dataclasses.asdict(config),
        teacher_return=agent.teacher_return,
        random_return=agent.random_return,
        evals=evals,
        seconds=seconds,
    )


def _teacher_env(teacher_dir: str) -> str | None:
    """The env id in the run.json of `teacher_dir` (None without one: `check_teacher_dir` then says why)."""
    try:
        with open(os.path.join(teacher_dir, "run.json")) as f:
            return json.load(f).get("env_id")
    except (FileNotFoundError, NotADirectoryError):
        return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--teacher", action="append", required=True, help="a finished DQN run directory (repeatable)")
    p.add_argument("--variant", action="append", default=None, help='"k=v;k=v" preset overrides ("" = preset)')
    p.add_argument("--steps", type=int, default=3000, help="offline gradient steps per student")
    p.add_argument("--every", type=int, default=500, help="gradient steps between evaluations")
    p.add_argument("--episodes", type=int, default=10, help="episodes per evaluation")
    p.add_argument("--seed", type=int, default=0, help="student initialisation seed")
    p.add_argument("--out", help="write the rows as JSON here")
    a = p.parse_args()
    rows = []
    for teacher in a.teacher:
        for text in a.variant or [""]:
            row = distil(teacher, parse_variant(text), a.steps, a.every, a.episodes, a.seed)
            # 0.9 of the way from a random policy's return to the teacher's (any sign of return, e.g. Acrobot's).
            target = row["random_return"] + 0.9 * (row["teacher_return"] - row["random_return"])
            reached = sum(r >= target for _, r in row["evals"])
            rows.append(row)
            print(
                f"{teacher} [{text or 'preset'}] R_T {row['teacher_return']:.1f}: evaluations "
                f"{[round(r, 1) for _, r in row['evals']]}, {reached}/{len(row['evals'])} >= {target:.1f} "
                f"(R_rand {row['random_return']:.1f} + 0.9 (R_T - R_rand)) "
                f"({row['seconds']:.0f} s)",
                flush=True,
            )
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
