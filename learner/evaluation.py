"""Evaluation of the current policy with its mean action (BatchPPO evaluates
the deterministic mean of the Gaussian policy)."""
from __future__ import annotations

import gymnasium as gym
import numpy as np

from actors.policy import policy_mean, to_env_action


def evaluate(arrays: dict, env_id: str, episodes: int, seed: int,
             action_low, action_high) -> list[float]:
    """Runs `episodes` full episodes with the mean action; returns their undiscounted returns.

    Args:
        arrays: exported policy weights with observation normalizer (actors.policy layout).
        action_low / action_high: the env's Box bounds ([A] floats).
    """
    env = gym.make(env_id)
    low, high = np.asarray(action_low, np.float32), np.asarray(action_high, np.float32)
    returns = []
    try:
        for i in range(episodes):
            obs, _ = env.reset(seed=seed + i)
            total, done = 0.0, False
            while not done:
                mean = policy_mean(arrays, np.asarray(obs, np.float32)[None])
                obs, reward, terminated, truncated, _ = env.step(to_env_action(mean, low, high)[0])
                total += float(reward)
                done = terminated or truncated
            returns.append(total)
    finally:
        env.close()
    return returns
