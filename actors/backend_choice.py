"""`--env-backend auto`: the env backend that steps this env fastest on this machine, chosen by measurement.

An actor given "auto" times a few batch steps (random actions) of its own batch of envs on each candidate
backend and keeps the fastest, already built: "sync" (every env in the actor process) always; "envpool" (C++
threads) where envpool has the env and it takes no --env-kwargs; "workers" (W processes of B / W envs each,
`rlfleet.actors.worker_envs`) where the machine has W ≥ 2 usable cores and an in-process batch step is slow
enough that W processes could save more than their round trip costs. Atari ids step on "ale", the only backend
that fits them. The choice and its timings are one line (`BackendChoice.reason`) in the actor's log and in the
learner's status.
"""

from __future__ import annotations

import dataclasses
import time

import gymnasium as gym

from rlfleet.actors.envs import EnvError, env_spec, is_atari, make_batched_env, split_env_id
from rlfleet.actors.worker_envs import usable_cores, worker_count

MEASURE_SECONDS = 0.25  # per candidate backend: batch steps are timed for at least this long
MIN_MEASURED_STEPS = 5  # and at least this many (an env of slow steps is timed over these alone)
WARMUP_STEPS = 2  # batch steps taken before the timing starts (first-call costs: caches, lazy imports)
# A batch step through worker processes costs at least one pipe round trip per worker on top of the envs' own
# work: where W workers could save less than this per batch step, they are not worth starting to measure.
WORKER_ROUND_TRIP_S = 100e-6


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
    timed over at least `seconds` and `MIN_MEASURED_STEPS` batch steps after `WARMUP_STEPS` untimed ones."""
    venv.reset(seed=0)
    venv.action_space.seed(0)
    for _ in range(WARMUP_STEPS):
        venv.step(venv.action_space.sample())
    steps, start = 0, time.monotonic()
    while True:
        venv.step(venv.action_space.sample())
        steps += 1
        elapsed = time.monotonic() - start
        if steps >= MIN_MEASURED_STEPS and elapsed >= seconds:
            return elapsed / steps


def _envpool_has(env_id: str) -> bool:
    """Whether the envpool backend can step `env_id`: envpool installed and knows it, Box actions, no kwargs."""
    if split_env_id(env_id)[1]:
        return False
    try:
        import envpool
    except ImportError:
        return False
    return env_id in envpool.list_all_envs() and env_spec(env_id).action_kind == "continuous"


def choose_backend(env_id: str, num_envs: int, cores: int | None = None) -> tuple[gym.vector.VectorEnv, BackendChoice]:
    """Builds `num_envs` envs of `env_id` on each candidate backend in turn (module doc), times them, closes the
    slower ones and returns the fastest, open, with the choice.

    Args:
        cores: usable cores (None: this process's affinity; `worker_envs.usable_cores`).
    Raises:
        EnvError: the env cannot be made (unknown id, missing package, bad --env-kwargs). A candidate other than
            "sync" that cannot step the env is left out, and the reason says why.
    """
    if is_atari(env_id):
        venv = make_batched_env(env_id, num_envs, "ale")
        return venv, BackendChoice("ale", {}, "ale: Atari ids step on ale-py's C++ vector env")
    timings, best, best_venv, notes = {}, None, None, []

    def consider(backend: str, optional: bool = True) -> None:
        nonlocal best, best_venv
        try:
            venv = make_batched_env(env_id, num_envs, backend)
        except EnvError as e:  # a candidate that cannot step this env after all: the others still can
            if not optional:
                raise
            notes.append(f"{backend} not usable: {e}")
            return
        try:
            timings[backend] = seconds_per_batch_step(venv)
        except BaseException:
            venv.close()
            raise
        if best is None or timings[backend] < timings[best]:
            if best_venv is not None:
                best_venv.close()
            best, best_venv = backend, venv
        else:
            venv.close()

    try:
        consider("sync", optional=False)
        if _envpool_has(env_id):
            consider("envpool")
        workers = worker_count(num_envs, cores)
        if workers >= 2 and timings["sync"] * (1 - 1 / workers) > WORKER_ROUND_TRIP_S * workers:
            consider("workers")
        elif workers >= 2:
            notes.append(f"workers not tried: {workers} processes could not save their round trips")
        else:
            usable = usable_cores() if cores is None else cores
            notes.append(f"workers not tried: {num_envs} envs cannot be shared evenly by 2 or more of {usable} cores")
    except BaseException:
        if best_venv is not None:
            best_venv.close()
        raise
    measured = ", ".join(f"{b} {t * 1e3:.3g} ms" for b, t in sorted(timings.items(), key=lambda bt: bt[1]))
    label = f"workers ({workers} processes x {num_envs // workers} envs)" if best == "workers" else best
    reason = f"{label}: fastest measured per batch step of {num_envs} envs ({measured})"
    reason += "".join(f"; {note}" for note in notes)
    return best_venv, BackendChoice(best, timings, reason)
