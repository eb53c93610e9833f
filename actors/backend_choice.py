"""`--env-backend auto`: the env backend that steps this env fastest on this machine, chosen by measurement.

An actor given "auto" times a few batch steps (random actions) of its own batch of envs on each candidate
backend and keeps the fastest, already built, where backends about as fast (within `SWITCH_MARGIN`) go by
preference: the env's default (envpool where it applies, else sync), then sync, then workers. The candidates:
"sync" (every env in the actor process) always; "envpool" (C++
threads) where envpool has the env and it takes no --env-kwargs; "workers" (W processes of B / W envs each,
`rlfleet.envs.workers`) where the machine has W ≥ 2 usable cores and an in-process batch step is slow
enough that W processes could save more than their round trip costs. Atari ids step on "ale", the only backend
that fits them. The choice and its timings are one line (`BackendChoice.reason`) in the actor's log and in the
learner's status.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import gymnasium as gym

from rlfleet.envs.core import env_spec, is_atari, make_batched_env, split_env_id
from rlfleet.envs.workers import WorkerVectorEnv, usable_cores, worker_count

MEASURE_SECONDS = 0.25  # per candidate backend: batch steps are timed for at least this long
MIN_MEASURED_STEPS = 5  # and at least this many, unless one batch step alone takes MEASURE_SECONDS or more
WARMUP_STEPS = 2  # batch steps taken before the timing starts (first-call costs: caches, lazy imports)
# A batch step through worker processes costs at least one pipe round trip per worker on top of the envs' own
# work: where W workers could save less than this per batch step, they are not worth starting to measure.
WORKER_ROUND_TRIP_S = 100e-6
# A backend later in the order of preference (the env's default: "envpool" where it can step the env, else
# "sync"; then "sync"; then "workers", which starts processes) is taken over an earlier one only when it measured
# faster per batch step by more than this fraction: short timings of backends that run about as fast vary from
# one start to the next, and the choice should not.
SWITCH_MARGIN = 0.10


@dataclasses.dataclass
class BackendChoice:
    """What `auto` chose for one actor's batch of envs, and why.

    Attributes:
        backend: the chosen backend ("sync", "envpool", "workers" or "ale").
        seconds_per_batch_step: {backend: wall seconds per batch step of all the actor's envs} for each
            backend measured (random actions, resets included).
        reason: one line for people (the actor's log, the learner's status).
    """

    backend: str
    seconds_per_batch_step: dict
    reason: str


def seconds_per_batch_step(venv: gym.vector.VectorEnv, seconds: float = MEASURE_SECONDS) -> float:
    """Wall seconds per batch step of `venv` with uniformly random actions (finished episodes reset in the step),
    timed over at least `seconds` and `MIN_MEASURED_STEPS` batch steps after `WARMUP_STEPS` untimed ones. An env
    so slow that one warm-up step takes `seconds` or more is timed by that step alone (so that measuring costs a
    few of its steps, not minutes).

    Raises:
        whatever the env raises in reset or step.
    """
    venv.reset(seed=0)
    venv.action_space.seed(0)
    for _ in range(WARMUP_STEPS):
        start = time.monotonic()
        venv.step(venv.action_space.sample())
        elapsed = time.monotonic() - start
        if elapsed >= seconds:
            return elapsed
    steps, start = 0, time.monotonic()
    while True:
        venv.step(venv.action_space.sample())
        steps += 1
        elapsed = time.monotonic() - start
        if steps >= MIN_MEASURED_STEPS and elapsed >= seconds:
            return elapsed / steps


def _close(venv: gym.vector.VectorEnv) -> None:
    """Closes a candidate that failed or lost, its worker processes terminated rather than waited for."""
    try:
        venv.close(terminate=True) if isinstance(venv, gym.vector.AsyncVectorEnv | WorkerVectorEnv) else venv.close()
    except Exception:  # noqa: BLE001 - a broken candidate may fail to close too; it is dropped either way
        pass


def _envpool_has(env_id: str) -> bool:
    """Whether the envpool backend can step `env_id`: envpool installed and knows it, Box actions, no kwargs."""
    if split_env_id(env_id)[1]:
        return False
    try:
        import envpool

        return env_id in envpool.list_all_envs() and env_spec(env_id).action_kind == "continuous"
    except Exception:  # noqa: BLE001 - not installed, or broken: envpool is then no candidate
        return False


class _Trial:
    """The candidates of one `choose_backend` call, tried in turn: their timings, the preferred one so far (kept
    open) and notes on those not tried or not usable."""

    def __init__(self, env_id: str, num_envs: int, workers: int, order: list[str], stop: threading.Event | None):
        self.env_id, self.num_envs, self.workers, self.order, self.stop = env_id, num_envs, workers, order, stop
        self.timings: dict[str, float] = {}
        self.best: str | None = None
        self.best_venv = None
        self.notes: list[str] = []

    def consider(self, backend: str, optional: bool = True) -> None:
        """Builds and times `backend`; keeps it open if it is preferred over the best so far (`preferred_over`),
        else closes it. A failure of an `optional` candidate is noted, not raised."""
        if optional and self.stop is not None and self.stop.is_set():  # sync, always there, is always measured
            self.notes.append(f"{backend} not tried: the actor is stopping")
            return
        venv = None
        try:
            workers = self.workers if backend == "workers" else None
            venv = make_batched_env(self.env_id, self.num_envs, backend, num_workers=workers)
            self.timings[backend] = seconds_per_batch_step(venv)
        except Exception as e:  # noqa: BLE001 - a candidate that fails here is left out; the others still work
            if venv is not None:
                _close(venv)
            if not optional:
                raise
            detail = (str(e).splitlines() or [""])[0].split("; ")[0]  # what failed, without a hint for people
            self.notes.append(f"{backend} not usable ({type(e).__name__}: {detail})")
            return
        except BaseException:
            if venv is not None:
                _close(venv)
            raise
        if self.best is None or self.preferred_over(backend, self.best):
            if self.best_venv is not None:
                _close(self.best_venv)
            self.best, self.best_venv = backend, venv
        else:
            _close(venv)

    def preferred_over(self, backend: str, other: str) -> bool:
        """Whether `backend` should replace `other`: an earlier one in `order` unless it is slower by more than
        `SWITCH_MARGIN`, a later one only when it is faster by more than that."""
        if self.order.index(backend) < self.order.index(other):
            return self.timings[backend] <= self.timings[other] * (1 + SWITCH_MARGIN)
        return self.timings[backend] * (1 + SWITCH_MARGIN) < self.timings[other]

    def consider_workers(self, usable: int) -> None:
        """Tries the `workers` backend where its processes could save more per batch step than their round trips
        cost; notes why not otherwise."""
        workers, sync = self.workers, self.timings["sync"]
        if workers >= 2 and sync * (1 - 1 / workers) > WORKER_ROUND_TRIP_S * workers:
            self.consider("workers")
        elif workers >= 2:
            self.notes.append(
                f"workers not tried: {workers} worker processes would save less per batch step than their round "
                "trips cost"
            )
        elif usable < 2:
            self.notes.append("workers not tried: only 1 usable core")
        else:
            self.notes.append(
                f"workers not tried: {self.num_envs} envs cannot be shared evenly by 2 or more of {usable} cores"
            )

    def reason(self) -> str:
        """Why the chosen backend: its timing against the others', and the notes."""
        timings, best, n = self.timings, self.best, self.num_envs
        measured = ", ".join(f"{b} {t * 1e3:.3g} ms" for b, t in sorted(timings.items(), key=lambda bt: bt[1]))
        label = f"workers ({self.workers} processes x {n // self.workers} envs)" if best == "workers" else best
        if best == min(timings, key=timings.get):
            reason = f"{label}: fastest measured per batch step of {n} envs ({measured})"
        else:
            why = "the default for this env" if best == self.order[0] else "in the actor process"
            reason = (
                f"{label}: {why}, within {SWITCH_MARGIN:.0%} of the fastest measured per batch step of {n} envs "
                f"({measured})"
            )
        return reason + "".join(f"; {note}" for note in self.notes)


def choose_backend(
    env_id: str, num_envs: int, cores: int | None = None, stop: threading.Event | None = None
) -> tuple[gym.vector.VectorEnv, BackendChoice]:
    """Builds `num_envs` envs of `env_id` (an env id, with --env-kwargs if any) on each candidate backend in turn
    (module doc), times them, closes the slower ones and returns the fastest, open, with the choice.

    Args:
        cores: usable cores (None: `rlfleet.envs.workers.usable_cores`, which counts CPU quotas too).
        stop: when set (SIGTERM/SIGINT), no candidate beyond "sync" is tried: the fastest so far is returned.
    Raises:
        EnvError: the env cannot be made in the actor process (unknown id, missing package, bad --env-kwargs);
            whatever the env raises in reset or step there. A candidate other than "sync" that cannot be built
            or fails while it is timed is left out, and the reason says why.
    """
    if is_atari(env_id):
        venv = make_batched_env(env_id, num_envs, "ale")
        return venv, BackendChoice("ale", {}, "ale: Atari ids step on ale-py's C++ vector env")  # as the actor says
    usable = usable_cores() if cores is None else cores
    base_id, kwargs = split_env_id(env_id)
    envpool_steps_it = _envpool_has(env_id)
    order = ["envpool", "sync", "workers"] if envpool_steps_it else ["sync", "workers"]
    trial = _Trial(env_id, num_envs, worker_count(num_envs, usable), order, stop)
    try:
        trial.consider("sync", optional=False)
        if envpool_steps_it:
            trial.consider("envpool")
        elif kwargs and _envpool_has(base_id):
            trial.notes.append("envpool not tried: it takes no --env-kwargs")
        trial.consider_workers(usable)
    except BaseException:
        if trial.best_venv is not None:
            _close(trial.best_venv)
        raise
    return trial.best_venv, BackendChoice(trial.best, trial.timings, trial.reason())
