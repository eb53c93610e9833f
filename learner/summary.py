"""summary.json: what the learner records of a run when it ends, finished, stopped early or failed.

Its fields, in this order: algo, env_id, preset, seed, total_steps (the env-step budget; 0: none), completed,
then for a run that ended: status_address, the algorithm's status values (`Agent.status_extras`, after the
final evaluation), final_eval_return_mean, final_eval_episodes and final_eval_returns (a completed run only),
replay_checkpoint_dir (a completed run that can teach), or for a failed one: fault, final_eval_return_mean,
final_eval_episodes; then the run's best evaluation (best_eval_return_mean, best_eval_env_steps,
best_checkpoint: null before the first); then the counters (`rlfleet.learner.status.counts`), for a run
that ended also replay and wall_seconds, and last checkpoint and config.
"""

from __future__ import annotations

import json
from typing import NamedTuple

import numpy as np

from rlfleet.learner.run_spec import RunSpec
from rlfleet.learner.status import counts


def _head(run: RunSpec, completed: bool, **more) -> dict:
    """The summary's first fields: algo, env_id, preset, seed, total_steps of `run`, completed, then `more`."""
    return dict(
        algo=run.settings.algo,
        env_id=run.settings.env_id,
        preset=run.settings.preset,
        seed=run.settings.seed,
        total_steps=run.settings.total_steps,
        completed=completed,
        **more,
    )


def _best_fields(best: dict | None) -> dict:
    """summary.json's fields of the run's best evaluation (`rlfleet.learner.progress.read_best`; None: none yet)."""
    best = best or {}
    return dict(
        best_eval_return_mean=best.get("eval_return_mean"),
        best_eval_env_steps=best.get("eval_env_steps"),
        best_checkpoint=best.get("checkpoint"),
    )


class FinalEvaluation(NamedTuple):
    """The final evaluation of a run: its episode returns (None: none ran, or it was interrupted) and the agent's
    `status_extras()` after it ("phase" is left out of the summary)."""

    returns: list[float] | None
    extras: dict


def end_summary(
    run: RunSpec,
    completed: bool,
    status_address: str,
    final: FinalEvaluation,
    status: dict,
    best: dict | None = None,
    *,
    wall_seconds: float,
    checkpoint: str,
    **more,
) -> dict:
    """The summary of a run that finished (`completed`) or was stopped early.

    Args:
        run: what the learner was told; status_address: host:port the learner served on.
        final: the final evaluation's returns and the agent's status extras after it.
        status: the learner's last status dict (`Learner.status_dict`, replay included).
        best: the run's best evaluation (`rlfleet.learner.progress.read_best`), or None.
        wall_seconds: seconds the run trained; checkpoint: the last checkpoint's path prefix.
        more: fields after the final evaluation's (evaluation_seconds, replay_checkpoint_dir).
    The run's resolved config (`run.settings.config`) is recorded last.
    """
    summary = _head(run, completed, status_address=status_address)
    summary.update({k: v for k, v in final.extras.items() if k != "phase"})
    returns = final.returns
    if returns is not None:
        summary.update(
            final_eval_return_mean=float(np.mean(returns)),
            final_eval_episodes=len(returns),
            final_eval_returns=returns,
        )
    else:
        summary.update(final_eval_return_mean=None, final_eval_episodes=0)
    summary.update(
        **more,
        **_best_fields(best),
        **counts(status),
        replay=status["replay"],
        wall_seconds=wall_seconds,
        checkpoint=checkpoint,
        config=json.loads(run.settings.config.to_json()),
    )
    return summary


def failure_summary(run: RunSpec, fault: str, status: dict, checkpoint: str | None, best: dict | None = None) -> dict:
    """The summary of a run whose training diverged: `fault` (what status showed), no final evaluation, the run's
    `best` evaluation before it (or None), the counters of the status dict `status`, the last (finite)
    `checkpoint` and the run's resolved config."""
    summary = _head(run, False)
    summary.update(
        fault=fault,
        final_eval_return_mean=None,
        final_eval_episodes=0,
        **_best_fields(best),
        **counts(status),
        checkpoint=checkpoint,
        config=json.loads(run.settings.config.to_json()),
    )
    return summary
