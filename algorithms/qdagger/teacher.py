"""Teacher run directories for QDagger (Reincarnating RL, Agarwal et al. 2022).

A finished DQN (or QDagger) run directory is a teacher: `run.json` (algo,
env, config), `checkpoints/` (its Q-network), `replay/` (a Reverb checkpoint
of its replay table, written at the end of the run) and `summary.json` (its
final evaluation return). So is a folder of `rlfleet import-teacher` (a
Q-network trained elsewhere, as ONNX or a SavedModel, and its data:
`rlfleet.algorithms.qdagger.outside`). `load_teacher` checks all of it before
anything starts and loads the teacher's Q-network.
"""

from __future__ import annotations

import dataclasses
import json
import os

import tensorflow as tf

from rlfleet.algorithms.qdagger.errors import TeacherError
from rlfleet.algorithms.qdagger.outside import IMPORTED, load_model
from rlfleet.common.logs import logger
from rlfleet.envs.core import EnvSpec
from rlfleet.learner.checkpoints import CheckpointError, checkpoint_numbers, restore_newest
from rlfleet.replay.checkpoints import REPLAY_SUBDIR, latest_checkpoint, usable_checkpoint

log = logger("qdagger")


def teacher_algos() -> list[str]:
    """The algorithms whose runs teach: those of a DQN Q-network and replay (DQN's builder or one extending it)."""
    from rlfleet import algorithms
    from rlfleet.algorithms.dqn import DQN

    return [name for name in algorithms.names() if isinstance(algorithms.get(name), DQN)]


@dataclasses.dataclass
class Teacher:
    """A loaded teacher.

    Attributes:
        directory: the teacher's run directory.
        q: its Q-network (maps observations [N, *obs_shape] to Q-values [N, A] float32), callable on tensors
            inside the learner's traced step.
        replay_checkpoint: its latest complete Reverb checkpoint directory.
        final_eval_return: its summary's final evaluation return (None when it has no summary).
    """

    directory: str
    q: object
    replay_checkpoint: str
    final_eval_return: float | None
    numpy_q: object = None  # the same Q-values for numpy observations: [N, *obs_shape] -> float32 [N, A]

    def __post_init__(self):
        if self.numpy_q is None:  # an rlfleet Q-network: the actors' numpy forward pass of its weights
            from rlfleet.algorithms.dqn.networks import export_q
            from rlfleet.algorithms.dqn.policy import q_values

            arrays = export_q(self.q)
            self.numpy_q = lambda obs: q_values(arrays, obs)


def read_run_record(directory: str, option: str, hint: str) -> dict:
    """The run.json of the folder `directory` that the command-line option `option` named.

    Raises:
        TeacherError: no such folder, no run.json, or one that does not read as a run's record (each message
            names `option` and ends with `hint`, what to give instead).
    """
    if not os.path.isdir(directory):
        raise TeacherError(f"{option} {directory}: no such directory; {hint}.")
    run_path = os.path.join(directory, "run.json")
    if not os.path.exists(run_path):
        raise TeacherError(f"{option} {directory}: no run.json, so this is not an rlfleet run directory; {hint}.")
    try:
        with open(run_path) as f:
            run = json.load(f)
    except (OSError, ValueError) as e:
        raise TeacherError(f"{option} {directory}: its run.json cannot be read ({e}); {hint}.") from None
    if not isinstance(run, dict):
        raise TeacherError(f"{option} {directory}: its run.json is not a run's record; {hint}.")
    return run


def check_teacher_dir(directory: str, spec: EnvSpec) -> dict:
    """Checks that `directory` is a teacher for `spec` without loading its network; returns its run.json.

    Raises:
        TeacherError: missing directory, run.json, checkpoint or replay
            checkpoint; another algorithm or env.
    """
    hint = (
        "pass the --logdir of a finished `rlfleet up --algo dqn` run on the same env, or a folder of "
        "`rlfleet import-teacher` (a Q-network trained elsewhere)"
    )
    run = read_run_record(directory, "--teacher", hint)
    teachers = teacher_algos()
    if run.get("algo") not in [*teachers, IMPORTED]:
        raise TeacherError(
            f"--teacher {directory}: it is a {run.get('algo')} run; a teacher must be a run of a DQN Q-network and "
            f"its replay ({', '.join(teachers)}); {hint}."
        )
    if run.get("env_id") != spec.env_id:
        raise TeacherError(f"--teacher {directory}: it was trained on {run.get('env_id')}, not {spec.env_id}; {hint}.")
    if run.get("algo") == IMPORTED:
        from rlfleet.algorithms.qdagger.outside import ONNX_FILE, SAVEDMODEL_DIR

        named = run.get("model") if isinstance(run.get("model"), dict) else {}
        if named.get("file") not in (ONNX_FILE, SAVEDMODEL_DIR):
            raise TeacherError(f"--teacher {directory}: its run.json names no model of its own; import it again.")
        model = os.path.join(directory, named["file"])
        if not os.path.exists(model):
            raise TeacherError(f"--teacher {directory}: its model {model} is missing; import the teacher again.")
    elif not checkpoint_numbers(os.path.join(directory, "checkpoints")):
        raise TeacherError(f"--teacher {directory}: no Q-network checkpoint in {directory}/checkpoints; {hint}.")
    if latest_checkpoint(os.path.join(directory, REPLAY_SUBDIR)) is None:
        raise TeacherError(
            f"--teacher {directory}: no Reverb replay checkpoint in {directory}/{REPLAY_SUBDIR}; a DQN run "
            "writes one when it finishes (or run `rlfleet replay-checkpoint --replay HOST:PORT` while its "
            "replay server, started with --checkpoint-dir, runs)."
        )
    return run


def items_n_step(run: dict, spec: EnvSpec) -> int:
    """The n of the n-step items in the replay of the teacher whose run.json is `run`."""
    if run.get("algo") == IMPORTED:
        return int(run.get("config", {}).get("n_step", 0))
    from rlfleet.algorithms.settings import make_algo_config

    return make_algo_config(run["algo"], run.get("preset", "default"), spec.env_id, run.get("config")).n_step


def check_items(directory: str, run: dict, spec: EnvSpec, config) -> None:
    """Refuses a student (settings `config`) whose n_step differs from the n of its teacher's replay items, which
    it reads as they are.

    Raises:
        TeacherError: with both values and the two ways to make them agree.
    """
    n = items_n_step(run, spec)
    if config.n_step != n:
        raise TeacherError(
            f"--teacher {directory}: its replay items hold {n}-step returns, and the student's n_step is "
            f"{config.n_step}; give the student --set n_step={n} (or, for a teacher of `rlfleet import-teacher`, "
            f"import it again with --n-step {config.n_step})."
        )


def check_guide(directory: str, run: dict) -> None:
    """Refuses a teacher that cannot guide the actors' episodes (JSRL): one imported from a model file, which the
    actors cannot run (`run`: its run.json).

    Raises:
        TeacherError: with the reason and what to give instead.
    """
    if run.get("algo") == IMPORTED:
        raise TeacherError(
            f"--teacher {directory}: its Q-network is a model file ({run.get('model', {}).get('format')}), which "
            "the actors cannot run, so it cannot guide their episodes (guide_roll_in_steps, JSRL); give an rlfleet "
            "DQN run as the teacher, or choose a method that uses the teacher on the learner only (qdagger, "
            "kickstarting, pretrain_finetune, rehearsal, dqfd)."
        )


def load_teacher(directory: str, spec: EnvSpec) -> Teacher:
    """Checks `directory` (see `check_teacher_dir`) and restores the teacher's Q-network for `spec`.

    Raises:
        TeacherError: see `check_teacher_dir`; also a Q-network whose shapes do
            not fit `spec` (another action count or observation size).
    """
    run = check_teacher_dir(directory, spec)
    q, numpy_q = _model_q(directory, run, spec) if run["algo"] == IMPORTED else _run_q(directory, run, spec)
    replay, skipped, _ = usable_checkpoint(os.path.join(directory, REPLAY_SUBDIR))
    if replay is None:  # the replay server serving it (`open_teacher_replay`) would find none either
        raise TeacherError(f"--teacher {directory}: no replay checkpoint of it can be read ({'; '.join(skipped)})")
    for line in skipped:
        log.warning("--teacher %s: skipped the damaged replay checkpoint %s", directory, line)
    summary_path = os.path.join(directory, "summary.json")
    final = None
    if os.path.exists(summary_path):
        with open(summary_path) as f:
            final = json.load(f).get("final_eval_return_mean")
    return Teacher(directory, q, replay, final, numpy_q)


def _model_q(directory: str, run: dict, spec: EnvSpec):
    """(q, numpy_q) of a folder of `rlfleet import-teacher`: its model file, checked against `spec` again."""
    try:
        model = load_model(os.path.join(directory, run["model"]["file"]), spec)
    except TeacherError as e:
        raise TeacherError(f"--teacher {directory}: {e}") from None
    return model, model.numpy


def _run_q(directory: str, run: dict, spec: EnvSpec):
    """(q, numpy_q) of an rlfleet run: its Q-network restored from its newest readable checkpoint."""
    from rlfleet.algorithms.dqn.networks import make_q_network
    from rlfleet.algorithms.settings import make_algo_config

    config = make_algo_config(run["algo"], run.get("preset", "default"), spec.env_id, run.get("config"))
    q = make_q_network(spec, config, 0, "teacher_q")
    try:
        _, skipped = restore_newest(os.path.join(directory, "checkpoints"), tf.train.Checkpoint(q=q), partial=True)
    except CheckpointError as e:
        raise TeacherError(
            f"--teacher {directory}: no Q-network of it can be restored for {spec.env_id} "
            f"({spec.action_dim} actions, observations {spec.obs_shape}): {e}"
        ) from None
    for line in skipped:
        log.warning("--teacher %s: skipped the damaged checkpoint %s", directory, line)
    return q, None  # `Teacher` makes the numpy forward pass of its weights
