"""The run directory: its identity (refuses to mix runs in one directory) and the files the learner writes.

Layout of RUN/: run.json (algo, env, preset, full config, seed, budget: `RunSettings.to_json`), settings.json
(the same resolved settings as `rlfleet up` gave them to its processes: `read_run_settings`), checkpoints/ (TensorFlow
checkpoints, each with a progress record beside it: `write_progress`), metrics.jsonl and tb/ (one row per
report interval, and one per update for an agent with `metrics_every_update`: `MetricsLog`), summary.json
(the run's end: `write_json`), logs/ (`rlfleet up`), replay/ (Reverb checkpoints of algorithms that keep their
replay).

`rlfleet up` calls `check_run_dir` before it starts any process, and the learner calls it again (it may be
started on its own), so a wrong --resume fails before anything runs. TensorFlow is imported only by
`MetricsLog`.
"""

from __future__ import annotations

import json
import math
import os
import shlex

from rlfleet.algorithms.settings import RunSettings
from rlfleet.common.files import atomic_write, open_json_lines, storage_error
from rlfleet.common.logs import logger
from rlfleet.learner.trackers import scalars_of

log = logger("learner")


class RunDirError(ValueError):
    """--logdir / --resume do not fit the run; the message names the conflict and the fix."""


def check_run_dir(logdir: str, resume: str | None, settings: RunSettings) -> None:
    """A used `logdir` needs `resume`; `resume` must hold a checkpoint, and its `run.json` the same algo, env,
    config values and (where both record one) seed as `settings`; the budget may change.

    Raises:
        RunDirError: naming the conflict and the fix.
    """
    if resume is None and os.path.exists(os.path.join(logdir, "checkpoints", "checkpoint")):
        raise RunDirError(
            f"--logdir {logdir} already holds a run (checkpoints/); continue it with "
            f"--resume {shlex.quote(str(logdir))}, or choose a new --logdir."
        )
    if resume is None:
        return
    run = settings.to_json()
    if os.path.exists(os.path.join(resume, "run.json")):
        with open(os.path.join(resume, "run.json")) as f:
            before = json.load(f)
        diffs = [f"{k}: {before.get(k)!r} -> {run[k]!r}" for k in ("algo", "env_id") if before.get(k) != run[k]]
        if "seed" in before and "seed" in run and before["seed"] != run["seed"]:
            diffs.append(f"seed: {before['seed']!r} -> {run['seed']!r}")
        recorded = before.get("config", {})
        diffs += [
            f"{k}: {v!r} -> {run['config'].get(k)!r}"
            for k, v in recorded.items()
            if k in run["config"] and run["config"].get(k) != v
        ]
        if diffs:
            raise RunDirError(
                f"--resume {resume}: this run was started with other settings "
                f"({'; '.join(diffs)}); resume it with the same --algo, --env, --env-kwargs, --config, --set and "
                f"--seed values, or with --resume {shlex.quote(str(resume))} alone (they are taken from the run)."
            )
    if not os.path.exists(os.path.join(resume, "checkpoints", "checkpoint")):
        from rlfleet.common.run_lock import busy

        held = busy(resume)  # a run that has written no checkpoint yet: that, not the directory, is the problem
        if held:
            raise RunDirError(f"--resume {resume}: {held}")
        raise RunDirError(
            f"--resume {resume}: no checkpoint found in {resume}/checkpoints; pass the --logdir of an earlier run."
        )


SETTINGS_FILE = "settings.json"  # RUN/settings.json: the resolved settings `up` gives every process
TEACHER_KIND = "teacher"  # run.json "kind" of a folder that only teaches (an imported teacher): not a run


def read_run_settings(path: str) -> RunSettings:
    """A run's resolved settings from `path`: a run.json, or a settings file (`rlfleet settings --out`,
    `rlfleet up` writes RUN/settings.json), both `RunSettings.to_json`'s content. Settings that the file does
    not record take the preset's value; `seed` and `total_steps` are None where it records none.

    Raises:
        RunDirError: unreadable file, missing keys, unknown algorithm, settings the algorithm refuses, or a
            seed or budget that is not a whole number ≥ 0 (the message starts with `path`).
    """
    try:
        with open(path) as f:
            run = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise RunDirError(f"{path}: cannot read it ({e}); pass a run.json or a settings file.") from None
    if isinstance(run, dict) and run.get("kind") == TEACHER_KIND:
        raise RunDirError(
            f"{path}: a teacher folder (`rlfleet import-teacher`), not a run: it has no checkpoint or settings of "
            "its own; give it to a student as --teacher (its summary.json holds the teacher's evaluation)."
        )
    try:
        return RunSettings.from_json(run, path)
    except ValueError as e:
        raise RunDirError(str(e)) from None


PROGRESS_SUFFIX = ".progress.json"  # beside each checkpoint: actor env steps, next actor id, wall time


def _json_safe(value):
    """`value` with every non-finite float (NaN: not measured yet, ±inf) as None, which JSON can hold."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def write_json(path: str, value: dict) -> None:
    """Writes `value` to `path` as indented JSON, atomically (`rlfleet.common.files.atomic_write`); a float that is
    not finite (NaN: a value not measured yet) is written as null, since JSON has no NaN.

    Raises:
        rlfleet.common.files.StorageError: it could not be written (full disk, read-only folder); the file
        before it, if any, is unchanged."""
    try:
        atomic_write(path, json.dumps(_json_safe(value), indent=2, allow_nan=False))
    except OSError as e:
        raise storage_error(e, os.path.basename(path), os.path.dirname(os.path.abspath(path)) or ".") from None


def progress_path(checkpoint: str) -> str:
    """The progress record's path beside the checkpoint prefix `checkpoint` (e.g. RUN/checkpoints/ckpt-3)."""
    return checkpoint + PROGRESS_SUFFIX


def write_progress(checkpoint: str, progress: dict) -> None:
    """Writes `progress` beside `checkpoint` (see `read_progress`), atomically; called before the checkpoint
    itself, so a latest checkpoint never lacks its record."""
    os.makedirs(os.path.dirname(checkpoint), exist_ok=True)  # before the first checkpoint makes it
    write_json(progress_path(checkpoint), progress)


def read_progress(checkpoint: str | None) -> dict:
    """What `write_progress` left beside `checkpoint`: {"next_actor_id": int, "wall_seconds": float (training
    time of the run so far, all processes), "evaluation_seconds": float (the part of it in evaluations; 0 in
    records written before it was kept), "actor_env_steps": {actor_id (int): that actor's cumulative env
    steps}, "recorded": bool (False: no record, so ids from 0 and no time: a new run (None), or a checkpoint
    written before records existed)}."""
    if checkpoint is None:
        return dict(next_actor_id=0, wall_seconds=0.0, evaluation_seconds=0.0, actor_env_steps={}, recorded=False)
    try:
        with open(progress_path(checkpoint)) as f:
            p = json.load(f)
    except FileNotFoundError:
        return read_progress(None)
    return dict(
        next_actor_id=int(p["next_actor_id"]),
        wall_seconds=float(p["wall_seconds"]),
        evaluation_seconds=float(p.get("evaluation_seconds", 0.0)),
        actor_env_steps={int(k): int(v) for k, v in p["actor_env_steps"].items()},
        recorded=True,
    )


ACTOR_IDS_FILE = "actor_ids.json"  # {"next_actor_id": int}: written at every registration


def read_next_actor_id(logdir: str) -> int:
    """The next actor id that RUN/actor_ids.json records (0 when there is none): ids below it were given out,
    checkpointed or not, so a restored learner gives out none of them again."""
    try:
        with open(os.path.join(logdir, ACTOR_IDS_FILE)) as f:
            return int(json.load(f)["next_actor_id"])
    except FileNotFoundError:
        return 0


def run_state(run_dir: str, total_steps: int) -> str:
    """What `rlfleet up` has left to do in `run_dir` for a budget of `total_steps` env steps: "done" (its
    summary.json says it completed at least that many), "resume" (it has a checkpoint) or "new"."""
    try:
        with open(os.path.join(run_dir, "summary.json")) as f:
            summary = json.load(f)
        if summary.get("completed") and int(summary.get("env_steps", 0)) >= total_steps:
            return "done"
    except (OSError, ValueError, TypeError, AttributeError):  # no summary, or one that is not a run's
        pass
    return "resume" if os.path.exists(os.path.join(run_dir, "checkpoints", "checkpoint")) else "new"


def _close_tracker(name: str, tracker, completed: bool) -> None:
    """Ends an experiment tracker's run; a failure is a warning (the run's own records are complete)."""
    try:
        tracker.close(completed)
    except Exception as e:  # whatever the tracker's package raised
        log.warning("--track %s: the tracked run did not end cleanly (%s: %s)", name, type(e).__name__, e)


class MetricsLog:
    """RUN/metrics.jsonl (one JSON object per row, NaN written as null; appended across resumes),
    RUN/tb (a TensorBoard scalar per numeric field, at step = the row's env_steps) and the experiment trackers
    `trackers` ({name: tracker}, `rlfleet.learner.trackers`; one that fails is dropped with a warning).

    A row's scalars are written, and the writer flushed, by one traced call per set of field names (up to
    `TRACED_FIELD_SETS` sets, then eagerly): with Python 3.11, TensorFlow 2.15 keeps about 100 bytes for every eager
    op it runs (tensorflow/tensorflow#62551), and a row written eagerly is tens of them, which a learner writing a
    row per update would keep for as long as it trains (`benchmarks/update_memory.py`).
    """

    TRACED_FIELD_SETS = 16

    def __init__(self, logdir: str, trackers: dict | None = None):
        import tensorflow as tf

        self.trackers = dict(trackers or {})
        self._tf = tf
        try:
            self.writer = tf.summary.create_file_writer(os.path.join(logdir, "tb"))
            self.file = open_json_lines(os.path.join(logdir, "metrics.jsonl"))  # a torn last row stays alone
        except BaseException:
            self.end_tracking(False)
            raise
        self._traced: dict[tuple[str, ...], object] = {}

    def _scalars_fn(self, names: tuple[str, ...]):
        """A tf.function (step int64 [], values float32 [len(names)]) -> None that writes one scalar per name at
        `step` and flushes the writer; None once `TRACED_FIELD_SETS` other sets have one, and for a set whose
        tracing failed."""
        if names in self._traced:
            return self._traced[names]
        fn = None
        if len(self._traced) < self.TRACED_FIELD_SETS:
            tf = self._tf

            @tf.function(input_signature=[tf.TensorSpec([], tf.int64), tf.TensorSpec([len(names)], tf.float32)])
            def fn(step, values):
                with self.writer.as_default(step=step):
                    for i, name in enumerate(names):
                        tf.summary.scalar(name, values[i])
                tf.summary.flush(self.writer)

            self._traced[names] = fn
        return fn

    def write(self, row: dict) -> None:
        """Appends `row` (it must hold "env_steps"; "time" is not plotted).

        Raises:
            rlfleet.common.files.StorageError: the row could not be written (full disk).
        """
        clean = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
        try:
            self.file.write(json.dumps(clean) + "\n")
            self.file.flush()
        except OSError as e:  # a full disk: StorageError, which the learner's command reports
            raise storage_error(e, "metrics.jsonl", os.path.dirname(self.file.name)) from None
        self._track(row)
        scalars = {
            k: float(v)
            for k, v in row.items()
            if k not in ("time", "env_steps") and isinstance(v, (int, float)) and not math.isnan(v)
        }
        if not scalars:
            return
        names = tuple(sorted(scalars))
        fn = self._scalars_fn(names)
        if fn is not None:
            tf = self._tf
            try:
                fn(tf.constant(int(row["env_steps"]), tf.int64), tf.constant([scalars[k] for k in names]))
                return
            except ValueError:  # a name a graph scope refuses (one that starts with "_", say), found when tracing:
                self._traced[names] = None  # nothing was written; this set is written eagerly from now on
        with self.writer.as_default(step=row["env_steps"]):
            for k, v in scalars.items():
                self._tf.summary.scalar(k, v)
        self.writer.flush()

    def _track(self, row: dict) -> None:
        if not self.trackers:
            return
        step, scalars = int(row["env_steps"]), scalars_of(row)
        for name, tracker in list(self.trackers.items()):
            try:
                tracker.log(step, scalars)
            except Exception as e:  # whatever the tracker's package raised: the row is in metrics.jsonl
                self.trackers.pop(name)
                log.warning("--track %s: stopped tracking this run (%s: %s)", name, type(e).__name__, e)
                _close_tracker(name, tracker, False)

    def end_tracking(self, completed: bool) -> None:
        """Ends each tracker's run, as finished (`completed`) or stopped."""
        trackers, self.trackers = self.trackers, {}
        for name, tracker in trackers.items():
            _close_tracker(name, tracker, completed)

    def close(self) -> None:
        """Closes the files; trackers still open end their runs as stopped."""
        self.end_tracking(False)
        self.file.close()
        self.writer.close()
