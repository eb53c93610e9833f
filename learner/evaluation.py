"""Evaluation episodes for the learner: the episode loops every algorithm's evaluation runs its policy in
(`Agent.evaluate`), their seeds, and the stop that interrupts them."""

from __future__ import annotations

import threading
from typing import Callable

import numpy as np

from rlfleet.actors.envs import env_seeds, make_batched_env, make_env, resolve_backend

# Set by the learner on SIGTERM/SIGINT: an evaluation in progress ends within one env step (it raises
# EvaluationInterrupted), so a stop is as prompt during an evaluation as between gradient steps.
STOP = threading.Event()


class EvaluationInterrupted(Exception):
    """The learner is stopping (`STOP` is set): the evaluation in progress was abandoned, no return counts."""


def evaluation_seed(run_seed: int) -> int:
    """The env seed of the first episode of every evaluation of a run seeded `run_seed` (episode i: + i).

    Offset by 10**6 from the run seed, away from the seeds the actors' envs start from; the same seeds each
    time, so a network evaluated again (e.g. a teacher restored from its checkpoint) scores the same.
    """
    return run_seed + 10**6


def _check_stop() -> None:
    if STOP.is_set():
        raise EvaluationInterrupted()


def run_episodes(env_id: str, episodes: int, seed: int, act: Callable[[np.ndarray], object]) -> list[float]:
    """Runs `episodes` full episodes; `act` maps one observation [1, obs_dim] to one env action.

    Returns the undiscounted return of each episode.
    Raises:
        EvaluationInterrupted: `STOP` was set (checked before every env step).
    """
    env = make_env(env_id)
    returns = []
    try:
        for i in range(episodes):
            obs, _ = env.reset(seed=env_seeds(seed + i, 1)[0])
            total, done = 0.0, False
            while not done:
                _check_stop()
                obs, reward, terminated, truncated, _ = env.step(act(np.asarray(obs, np.float32)[None]))
                total += float(reward)
                done = terminated or truncated
            returns.append(total)
    finally:
        env.close()
    return returns


def run_batched_episodes(
    env_id: str, episodes: int, seed: int, act: Callable[[np.ndarray], np.ndarray], max_steps: int = 10**6
) -> list[float]:
    """Runs one episode in each of `episodes` envs stepped as one batch (Atari: ale-py, else in-process).

    `act` maps observations [B, ...] to actions [B]. Episodes still running
    after `max_steps` batch steps are cut (their partial return counts).
    Returns the undiscounted return of each episode, env order.
    Raises:
        EvaluationInterrupted: `STOP` was set (checked before every batch step).
    """
    backend = resolve_backend(env_id, "auto")
    venv = make_batched_env(env_id, episodes, backend if backend == "ale" else "sync")
    try:
        obs, _ = venv.reset(seed=env_seeds(seed, episodes))
        totals = np.zeros(episodes)
        running = np.ones(episodes, bool)
        for _ in range(max_steps):
            _check_stop()
            obs, reward, terminated, truncated, _ = venv.step(act(obs))
            totals += np.where(running, reward, 0.0)
            running &= ~(terminated | truncated)
            if not running.any():
                break
    finally:
        venv.close()
    return totals.tolist()
