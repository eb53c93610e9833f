"""The run directory's identity: refuses to mix runs in one directory.

`rlfleet up` calls `check_run_dir` before it starts any process, and the learner calls it again (it may be
started on its own), so a wrong --resume fails before anything runs. No TensorFlow import here.
"""
from __future__ import annotations

import json
import os


class RunDirError(ValueError):
    """--logdir / --resume do not fit the run; the message names the conflict and the fix."""


def run_identity(algo: str, env_id: str, preset: str, config_json: str, teacher: str | None = None) -> dict:
    """What `run.json` records of a run: algo, env id, preset, the full config (dict) and a QDagger teacher."""
    run = dict(algo=algo, env_id=env_id, preset=preset, config=json.loads(config_json))
    if teacher:
        run["teacher"] = os.path.abspath(teacher)
    return run


def check_run_dir(logdir: str, resume: str | None, run: dict) -> None:
    """A used `logdir` needs `resume`; `resume` must hold a checkpoint, and its `run.json` the same algo, env
    and config values as `run` (from `run_identity`).

    Raises:
        RunDirError: naming the conflict and the fix.
    """
    if resume is None and os.path.exists(os.path.join(logdir, "checkpoints", "checkpoint")):
        raise RunDirError(f"--logdir {logdir} already holds a run (checkpoints/); continue it with "
                          f"--resume {logdir}, or choose a new --logdir.")
    if resume is None:
        return
    if os.path.exists(os.path.join(resume, "run.json")):
        with open(os.path.join(resume, "run.json")) as f:
            before = json.load(f)
        diffs = [f"{k}: {before.get(k)!r} -> {run[k]!r}" for k in ("algo", "env_id") if before.get(k) != run[k]]
        diffs += [f"{k}: {v!r} -> {run['config'].get(k)!r}" for k, v in before.get("config", {}).items()
                  if run["config"].get(k) != v]
        if diffs:
            raise RunDirError(f"--resume {resume}: this run was started with other settings "
                              f"({'; '.join(diffs)}); resume it with the same --algo, --env, --config and --set "
                              "values.")
    if not os.path.exists(os.path.join(resume, "checkpoints", "checkpoint")):
        raise RunDirError(f"--resume {resume}: no checkpoint found in {resume}/checkpoints; "
                          "pass the --logdir of an earlier run.")
