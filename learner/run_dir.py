"""The run directory's identity: refuses to mix runs in one directory.

`rlfleet up` calls `check_run_dir` before it starts any process, and the learner calls it again (it may be
started on its own), so a wrong --resume fails before anything runs. No TensorFlow import here.
"""

from __future__ import annotations

import json
import os

# What a setting that a run.json does not record meant when that run started: the behaviour before the
# setting existed (issue 9 added them). A resumed run must keep it, or its checkpoint would be restored
# into another network or trained by another rule.
LEGACY_SETTINGS = {
    "ppo": dict(
        activation="relu",
        mean_head="tanh",
        policy_objective="kl_penalty",
        reward_scale="rms",
        max_grad_norm=0.0,
        obs_normalization=True,
        lr_schedule="constant",
    ),
    "dqn": dict(double_q=False, lr_schedule="constant", lr_final_fraction=0.0),
    "qdagger": dict(double_q=False),
}


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
        raise RunDirError(
            f"--logdir {logdir} already holds a run (checkpoints/); continue it with "
            f"--resume {logdir}, or choose a new --logdir."
        )
    if resume is None:
        return
    if os.path.exists(os.path.join(resume, "run.json")):
        with open(os.path.join(resume, "run.json")) as f:
            before = json.load(f)
        diffs = [f"{k}: {before.get(k)!r} -> {run[k]!r}" for k in ("algo", "env_id") if before.get(k) != run[k]]
        if not diffs and before.get("algo") == "ppo" and "max_importance_weight" not in before.get("config", {}):
            raise RunDirError(
                f"--resume {resume}: this PPO run was started by an rlfleet before issue 9 "
                "(time limits treated as terminal, no decoupled proximal objective); its "
                "checkpoint cannot be continued by this version. Start a new run."
            )
        recorded = {**LEGACY_SETTINGS.get(before.get("algo"), {}), **before.get("config", {})}
        diffs += [
            f"{k}: {v!r} -> {run['config'].get(k)!r}"
            for k, v in recorded.items()
            if k in run["config"] and run["config"].get(k) != v
        ]
        if diffs:
            raise RunDirError(
                f"--resume {resume}: this run was started with other settings "
                f"({'; '.join(diffs)}); resume it with the same --algo, --env, --config and --set "
                "values."
            )
    if not os.path.exists(os.path.join(resume, "checkpoints", "checkpoint")):
        raise RunDirError(
            f"--resume {resume}: no checkpoint found in {resume}/checkpoints; pass the --logdir of an earlier run."
        )
