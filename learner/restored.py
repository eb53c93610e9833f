"""A run's policy restored from its checkpoints outside the learner, for `rlfleet eval` and `rlfleet export`: the
algorithm, env and settings from RUN/run.json, the network (with its observation normalizer) from the latest,
the best (RUN/checkpoints/best) or a numbered checkpoint. No replay server and no learner are needed."""

from __future__ import annotations

import dataclasses
import os
import re

import tensorflow as tf

from rlfleet import algorithms
from rlfleet.algorithms.settings import RunSettings
from rlfleet.common.logs import logger
from rlfleet.envs.core import EnvSpec, env_spec
from rlfleet.learner.checkpoints import CheckpointError, restore_newest
from rlfleet.learner.progress import BEST_SUBDIR, read_best
from rlfleet.learner.run_dir import RunDirError, read_run_settings

log = logger("learner")

LATEST, BEST = "latest", "best"


class RestoreError(ValueError):
    """A run's policy cannot be restored; the message names the run directory, the cause and the fix."""


@dataclasses.dataclass
class RestoredRun:
    """A run's policy as one checkpoint holds it.

    Attributes:
        run_dir: the run directory.
        algo / env_id / preset / seed: the run's (run.json; seed 0 where it records none).
        spec: the env's spaces.
        agent: an agent that only acts (`AlgorithmBuilder.make_policy_agent`), holding the checkpoint's weights.
        checkpoint: the checkpoint's path prefix (RUN/checkpoints/ckpt-N or RUN/checkpoints/best/ckpt-N).
        env_steps / policy_version / learner_steps: the run's counters when it was written; for the best
            checkpoint, env_steps is where its evaluation began (the network's, as `read_best` records it).
        best: the best evaluation's record (`read_best`) when the best checkpoint was chosen, else None.
    """

    run_dir: str
    algo: str
    env_id: str
    preset: str
    seed: int
    spec: EnvSpec
    agent: object
    checkpoint: str
    env_steps: int
    policy_version: int
    learner_steps: int
    best: dict | None = None


def parse_checkpoint_choice(text: str) -> str | int:
    """`--checkpoint` as given: "latest", "best" or a checkpoint number N (ckpt-N; "ckpt-N" is taken too).

    Raises:
        ValueError: anything else (the message lists what is taken).
    """
    text = str(text).strip()
    if text in (LATEST, BEST):
        return text
    m = re.fullmatch(r"(?:ckpt-)?(\d+)", text)
    if not m:
        raise ValueError(f"--checkpoint {text!r}: give latest, best or a checkpoint number N (RUN/checkpoints/ckpt-N).")
    return int(m.group(1))


def _run_settings(run_dir: str) -> tuple[RunSettings, EnvSpec]:
    """The settings run.json records of the run directory `run_dir`, and its env's spec.

    Raises:
        RestoreError: no such directory, no run.json, one that does not parse, an env that cannot be made here.
    """
    if not os.path.isdir(run_dir):
        raise RestoreError(f"{run_dir}: no such directory; give the --logdir of an rlfleet run.")
    run_json = os.path.join(run_dir, "run.json")
    if not os.path.exists(run_json):
        raise RestoreError(f"{run_dir}: no run.json, so this is not an rlfleet run directory; give a run's --logdir.")
    try:
        run = read_run_settings(run_json)
    except RunDirError as e:
        raise RestoreError(str(e)) from None
    try:
        return run, env_spec(run.env_id)
    except ValueError as e:  # EnvError: an env (or its package) this machine does not have
        raise RestoreError(f"{run_dir}: the run's env cannot be made here: {e}") from None


def restore_run(run_dir: str, choice: str | int = LATEST) -> RestoredRun:
    """Restores the policy of the run directory `run_dir` from the checkpoint `choice` ("latest": the newest one
    that reads whole, skipping damaged ones with a warning; "best": RUN/checkpoints/best; N: ckpt-N).

    Raises:
        RestoreError: no run.json, one that does not parse, an env that cannot be made here (its module not
            installed), no such checkpoint, or none that reads.
    """
    where = run_dir
    run, spec = _run_settings(run_dir)
    seed = run.seed or 0
    agent = algorithms.get(run.algo).make_policy_agent(spec, run.config, seed)
    counters = {k: tf.Variable(0, dtype=tf.int64) for k in ("env_steps", "weights_version", "learner_steps")}
    checkpoint = tf.train.Checkpoint(**agent.checkpoint_items(), **counters)
    folder = os.path.join(run_dir, "checkpoints")
    best = None
    if choice == BEST:
        folder = os.path.join(folder, BEST_SUBDIR)
        best = read_best(run_dir)
        if best is None:
            raise RestoreError(
                f"{where}: no best checkpoint (checkpoints/{BEST_SUBDIR}); the learner keeps one from its first "
                "evaluation on. Use --checkpoint latest."
            )
    try:
        number = None if choice in (LATEST, BEST) else int(choice)
        path, skipped = restore_newest(folder, checkpoint, partial=True, number=number)
    except CheckpointError as e:
        hint = " (the best evaluation's checkpoint: --checkpoint best)" if choice not in (LATEST, BEST) else ""
        raise RestoreError(f"{where}: {e}{hint}") from None
    for line in skipped:
        log.warning("%s: skipped the damaged checkpoint %s", where, line)
    agent.sync_from_checkpoint()
    env_steps = int(counters["env_steps"].numpy())
    agent.on_resume(env_steps)
    if best is not None:  # the network is the one evaluated; actors collected on while the evaluation ran
        env_steps = best["eval_env_steps"]
    return RestoredRun(
        run_dir=run_dir,
        algo=run.algo,
        env_id=run.env_id,
        preset=run.preset,
        seed=seed,
        spec=spec,
        agent=agent,
        checkpoint=path,
        env_steps=env_steps,
        policy_version=int(counters["weights_version"].numpy()),
        learner_steps=int(counters["learner_steps"].numpy()),
        best=best,
    )
