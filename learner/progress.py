"""A run's progress in checkpoints: the agent's variables and the run's counters in RUN/checkpoints (written and
read by `rlfleet.learner.checkpoints`), restored on --resume; the agent of the run's best evaluation so far in
RUN/checkpoints/best; and the replay server's checkpoint in RUN/replay at the end of a run that can teach."""

from __future__ import annotations

import json
import os
import shlex

import tensorflow as tf

from rlfleet.common.files import StorageError
from rlfleet.common.logs import NOTICE, logger
from rlfleet.learner.checkpoints import (
    CheckpointError,
    CheckpointStore,
    checkpoint_numbers,
    quarantine,
    restore_newest,
)
from rlfleet.learner.errors import LearnerError
from rlfleet.learner.run_dir import progress_path, read_progress
from rlfleet.replay.checkpoints import REPLAY_SUBDIR, ReplayCheckpointError, checkpoint_replay

log = logger("learner")

BEST_SUBDIR = "best"  # RUN/checkpoints/best: the checkpoint of the run's best evaluation so far

# The learner's counters (`Learner.count`), each saved in checkpoints as an int64 variable.
COUNTERS = ("learner_steps", "env_steps", "policy_version", "consumed_env_steps", "dropped_env_steps", "updates")


class ProgressCheckpoints:
    """The checkpoints of one run directory: the agent's `checkpoint_items()` and the counters, with the progress
    record (`rlfleet.learner.run_dir.read_progress`) beside each; the newest 3 are kept.

    The training loop and status count in Python ints (an eager TensorFlow op per count would cost memory and
    time at every step); the variables hold them for checkpoints only (`save`).

    Args:
        agent: the run's `Agent` (`rlfleet.algorithms.base`).
        logdir: the run directory (its checkpoints/ is created at the first save).
    """

    def __init__(self, agent, logdir: str):
        self.agent, self.logdir = agent, logdir
        self.counters = {k: tf.Variable(0, dtype=tf.int64) for k in COUNTERS}
        # Checkpoints name the policy version's variable "weights_version", the status contract's name for it.
        saved = {("weights_version" if k == "policy_version" else k): v for k, v in self.counters.items()}
        checkpoint = tf.train.Checkpoint(**agent.checkpoint_items(), **saved)
        self.store = CheckpointStore(os.path.join(logdir, "checkpoints"), checkpoint, keep=3)
        self.best_store = CheckpointStore(os.path.join(logdir, "checkpoints", BEST_SUBDIR), checkpoint, keep=1)

    @property
    def latest(self) -> str | None:
        """The newest checkpoint's path prefix (RUN/checkpoints/ckpt-N), or None before the first."""
        return self.store.latest

    def restore(self, resume: str, total_steps: int) -> tuple[dict, dict]:
        """Restores agent and counters from the newest intact checkpoint of the run directory `resume` (the
        damaged ones newer than it are skipped with a warning, and moved aside when `resume` is this run's own
        directory); `total_steps` is the run's env-step budget (0: none), for the message when it is reached.

        Returns:
            ({counter: value}, the checkpoint's progress record).
        Raises:
            LearnerError: no checkpoint of `resume` can be read.
        """
        folder = os.path.join(resume, "checkpoints")
        try:
            latest, skipped = restore_newest(folder, self.store.checkpoint)
        except CheckpointError as e:
            raise LearnerError(
                f"--resume {resume}: {e}. Resume from an intact run directory, or start a new run."
            ) from None
        for line in skipped:
            log.warning("skipped the damaged checkpoint %s", line)
        if skipped and os.path.abspath(resume) == os.path.abspath(self.logdir):  # its own: moved aside
            moved = quarantine(folder, skipped)
            if moved:
                log.warning("moved the damaged checkpoint files aside: %s", ", ".join(moved))
        self.agent.sync_from_checkpoint()
        count = {k: int(v.numpy()) for k, v in self.counters.items()}
        self.agent.on_resume(count["env_steps"])
        log.log(NOTICE, "resumed from %s", latest)
        if total_steps and count["env_steps"] >= total_steps:
            log.warning(
                "this run already has %s of its %s env steps: it evaluates and finishes again. To train on, raise "
                "--total-steps (docker-compose: RLFLEET_TOTAL_STEPS); for a new run, give another run directory "
                "(RLFLEET_RUN).",
                f"{count['env_steps']:,}",
                f"{total_steps:,}",
            )
        return count, read_progress(latest)

    def save(self, count: dict, actors: dict, wall_seconds: float, evaluation_seconds: float = 0.0) -> str:
        """Writes the next checkpoint: the agent's variables (after `Agent.sync_to_checkpoint`), the counters
        `count` ({counter: value}) and the progress record of the actors' book `actors`
        (`ActorRegistry.progress()`: actors away keep their place) and `wall_seconds` trained.

        Returns:
            its path prefix (RUN/checkpoints/ckpt-N).
        Raises:
            rlfleet.common.files.StorageError: it could not be written (`CheckpointStore.save`).
        """
        return self._save_to(self.store, count, actors, wall_seconds, evaluation_seconds=evaluation_seconds)

    def save_best(
        self,
        count: dict,
        actors: dict,
        wall_seconds: float,
        eval_return_mean: float,
        eval_env_steps: int,
        evaluation_seconds: float = 0.0,
    ):
        """Writes the checkpoint of a new best evaluation into RUN/checkpoints/best (only it is kept), as `save`
        does, its record adding the evaluation's mean return and the env steps it was made at (`read_best`).

        Returns:
            its path prefix (RUN/checkpoints/best/ckpt-N).
        Raises:
            rlfleet.common.files.StorageError: it could not be written.
        """
        best = dict(eval_return_mean=float(eval_return_mean), eval_env_steps=int(eval_env_steps))
        return self._save_to(
            self.best_store, count, actors, wall_seconds, evaluation_seconds=evaluation_seconds, **best
        )

    def _save_to(self, store: CheckpointStore, count: dict, actors: dict, wall_seconds: float, **more) -> str:
        for name, variable in self.counters.items():
            variable.assign(count[name])
        progress = dict(
            next_actor_id=actors["next_actor_id"],
            wall_seconds=wall_seconds,
            actor_env_steps={str(i): n for i, n in actors["actor_env_steps"].items()},
            **more,
        )
        self.agent.sync_to_checkpoint()
        return store.save(progress)


def read_best(logdir: str) -> dict | None:
    """The best evaluation that the run directory `logdir` kept (`ProgressCheckpoints.save_best`):
    {"eval_return_mean": float, "eval_env_steps": int, "checkpoint": RUN/checkpoints/best/ckpt-N}, or None where
    it kept none (or its record cannot be read: the next evaluation then becomes the best)."""
    folder = os.path.join(logdir, "checkpoints", BEST_SUBDIR)
    numbers = checkpoint_numbers(folder)
    if not numbers:
        return None
    checkpoint = os.path.join(folder, f"ckpt-{numbers[0]}")
    try:
        with open(progress_path(checkpoint)) as f:
            record = json.load(f)
        return dict(
            eval_return_mean=float(record["eval_return_mean"]),
            eval_env_steps=int(record["eval_env_steps"]),
            checkpoint=checkpoint,
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def checkpoint_run_replay(replay_address: str, logdir: str) -> str | None:
    """Has the replay server at `replay_address` write a Reverb checkpoint; returns the folder it keeps its
    checkpoints in when that is the run directory `logdir`'s replay/ (None, with a warning, when the checkpoint
    failed or went elsewhere)."""
    inside = os.path.join(os.path.abspath(logdir), REPLAY_SUBDIR)
    try:
        path = checkpoint_replay(replay_address, root=inside)
    except (ReplayCheckpointError, StorageError) as e:
        log.warning("%s", e)
        return None
    if path is None:
        log.warning(
            "the replay server checkpointed outside this run directory; start `rlfleet replay` with "
            "--checkpoint-dir %s so that the run directory can serve as a teacher.",
            shlex.quote(inside),
        )
        return None
    log.info("replay checkpoint %s", path)
    return os.path.dirname(path)
