"""The learner's errors (the `rlfleet learner` command shows their messages as they are, exit code 2), and the
check that training stayed finite."""

from __future__ import annotations

import dataclasses

import numpy as np


class LearnerError(RuntimeError):
    """A learner setup problem with a message that says how to fix it."""


class NonFiniteError(LearnerError):
    """Training produced a NaN/inf loss or weights: nothing of it was published or checkpointed."""


def non_finite(values: dict) -> list[str]:
    """Names of the entries of `values` ({name: number or numpy array}) holding a NaN or inf (floats only)."""
    bad = []
    for name, v in values.items():
        a = np.asarray(v)
        if a.dtype.kind in "fc" and not np.isfinite(a).all():
            bad.append(name)
    return bad


def check_finite(values: dict, what: str, config, learner_steps: int, latest: str | None) -> None:
    """Checks that every entry of `values` ({name: number or numpy array}) is finite.

    Args:
        what: what the values are (weights, losses), for the message.
        config: the algorithm's settings (a dataclass): the message names those that usually cause it.
        learner_steps: the learner step it happened at; latest: the last (finite) checkpoint, or None.
    Raises:
        NonFiniteError: naming the NaN/inf entries, the settings and the last checkpoint.
    """
    bad = non_finite(values)
    if not bad:
        return
    fields = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else vars(config)
    suspects = {k: v for k, v in fields.items() if "learning_rate" in k or "reward" in k or "lr_" in k}
    raise NonFiniteError(
        f"training diverged at learner step {learner_steps}: the {what} "
        f"{', '.join(sorted(bad)[:5])} {'is' if len(bad) == 1 else 'are'} not finite (NaN/inf). This is the "
        "learner's side, not the envs': nothing of it was published to the actors or checkpointed"
        + (f" (the last checkpoint, {latest}, is from before)" if latest else "")
        + f". Settings that usually cause it: {', '.join(f'{k}={v}' for k, v in suspects.items())}; "
        "start a new run with a lower learning rate (--set learning_rate=...) or smaller rewards."
    )


class LearnerStopped(LearnerError):
    """SIGTERM/SIGINT reached the learner while it waited to start (for its settings or the replay server):
    nothing was trained, so there is nothing to checkpoint."""
