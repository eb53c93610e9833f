"""`rlfleet import-teacher`: a Q-network trained outside rlfleet, and its data, made into a folder that
`--teacher` takes (`rlfleet.algorithms.qdagger.importing`)."""

from __future__ import annotations

import shlex
import sys

import click

from rlfleet.deploy.cli_common import Path, fail, quiet_tf
from rlfleet.deploy.run_tools import EXIT_STOPPED  # stopped by SIGINT/SIGTERM: nothing partial is left


@click.command("import-teacher")
@click.option("--env", "env_id", required=True, help="The env the teacher acts in (a discrete-action env id).")
@click.option(
    "--algo",
    default="qdagger",
    show_default=True,
    help="The students' algorithm (its n_step for the env is the items' default); every algorithm with a "
    "teacher of the same n_step reads the folder alike.",
)
@click.option(
    "--model",
    required=True,
    type=Path(exists=True),
    help="The teacher's Q-network: an ONNX file, or a TensorFlow SavedModel folder (e.g. of `rlfleet export`); "
    "observations [N, *obs] in, one value per action [N, A] out.",
)
@click.option("--out", required=True, type=Path(), help="The teacher folder to write (new, or empty).")
@click.option(
    "--data",
    default=None,
    metavar="RUN_DIR|minari:DATASET_ID",
    help="The teacher's data: an rlfleet run directory's replay, or a local Minari dataset.",
)
@click.option(
    "--generate-steps",
    type=click.IntRange(min=1),
    default=None,
    help="Instead of --data: the teacher acts for this many env steps (rounded up to a multiple of its 8 envs) "
    "and its transitions are the data.",
)
@click.option("--epsilon-start", type=click.FloatRange(0, 1), default=1.0, show_default=True,
              help="--generate-steps: ε of the teacher's ε-greedy actions at the first step.")  # fmt: skip
@click.option("--epsilon-end", type=click.FloatRange(0, 1), default=0.01, show_default=True,
              help="--generate-steps: ε at the last step (linear in between).")  # fmt: skip
@click.option("--n-step", type=click.IntRange(min=1), default=None,
              help="The items' n-step returns (default: qdagger's for the env); students use the same n.")  # fmt: skip
@click.option("--eval-episodes", type=click.IntRange(min=0), default=10, show_default=True,
              help="Episodes of the teacher's evaluation (its summary.json).")  # fmt: skip
@click.option("--seed", type=click.IntRange(0, 2**31 - 1), default=0, show_default=True,
              help="Env seeds of the generating envs (the evaluation's start 8 above).")  # fmt: skip
def import_teacher_cmd(**o):
    """Make a teacher folder from a Q-network trained elsewhere and its data.

    The model is checked against the env (its input takes the env's observations, it outputs one value per
    action), the data too (a run of the same env, or a Minari dataset of the same env and spaces); the data is
    written as rlfleet's replay items into OUT/replay. Then `rlfleet up --algo qdagger --teacher OUT` (or any
    algorithm with a teacher) learns from it (docs: QDagger, Teachers from outside rlfleet).
    """
    quiet_tf()
    from rlfleet import algorithms
    from rlfleet.common.files import StorageError

    env_id, model, out = o["env_id"], o["model"], o["out"]
    settings = dict(
        data=o["data"],
        generate_steps=o["generate_steps"] or 0,
        epsilon=(o["epsilon_start"], o["epsilon_end"]),
        n_step=o["n_step"],
        seed=o["seed"],
        eval_episodes=o["eval_episodes"],
    )
    try:
        builder = algorithms.get(o["algo"])
    except ValueError as e:  # an unknown algorithm, or a plugin that fails (the registry says which)
        fail(str(e))
    if not builder.uses_teacher:
        with_teacher = [name for name in algorithms.names() if algorithms.get(name).uses_teacher]
        fail(f"--algo {o['algo']} learns from no teacher; choose one that does: {', '.join(with_teacher)}.")
    from rlfleet.algorithms.library import evaluation
    from rlfleet.common.stopping import on_stop_signals

    on_stop_signals(evaluation.STOP.set)
    try:
        record = builder.import_teacher(model, env_id, out, **settings)
    except evaluation.EvaluationInterrupted:
        click.echo(f"rlfleet import-teacher: stopped; nothing was left at --out {out}.", err=True)
        sys.exit(EXIT_STOPPED)
    except (ValueError, StorageError) as e:  # a bad teacher, data or env (each says why)
        fail(str(e))
    except OSError as e:  # reading the model or the data, or writing the folder beside --out
        fail(f"{e.strerror or e}: {e.filename or out} (nothing was left at --out {out}).")
    _said(record, o["algo"], env_id, out)


def _said(record: dict, algo: str, env_id: str, out: str) -> None:
    """What was imported, the teacher's evaluation, and the command that learns from it (with the items'
    n_step where the algorithm's default differs)."""
    import json
    import os

    from rlfleet.algorithms.settings import make_algo_config

    data, n_step = record["data"], record["config"]["n_step"]
    transitions = data.get("transitions") or data.get("generated_by_teacher")
    click.echo(
        f"rlfleet import-teacher: {record['model']['format']} Q-network for {env_id}, "
        + (f"{transitions:,} transitions of data" if transitions else f"the replay of {data.get('run')}")
        + f" ({n_step}-step items) -> {out}"
    )
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    if summary.get("final_eval_episodes"):
        click.echo(
            f"  teacher evaluation: {summary['final_eval_return_mean']:.1f} over {summary['final_eval_episodes']} "
            "episodes (ε 0.001; the students measure it again at their start)"
        )
    command = ["rlfleet", "up", "--algo", algo, "--env", env_id, "--teacher", out, "--logdir", "RUN_DIR"]
    if make_algo_config(algo, "default", env_id).n_step != n_step:
        command += ["--set", f"n_step={n_step}"]
    click.echo("learn from it: " + shlex.join(command))
