"""The behaviour policy as the actors run it: plain numpy on pushed weights.

A 200-100 MLP on a batch of 16 costs ~20 µs as numpy matrix products against
~0.4 ms per `tf.function` call (measured on the 2-core development machine), so actors do not run
TensorFlow. The learner's `learner.networks.GaussianPolicy` exports its
variables under the names used here, together with the observation normalizer.
"""
from __future__ import annotations

import numpy as np

OBS_MEAN, OBS_STD = "obs_norm/mean", "obs_norm/std"
LOG_STD = "policy/log_std"
OBS_CLIP = 5.0  # BatchPPO clips normalised observations to ±5


def layer_names(i: int) -> tuple[str, str]:
    """Names of the kernel and bias of policy layer `i` (the last one is the mean head)."""
    return f"policy/w{i}", f"policy/b{i}"


def normalize_obs(arrays: dict, obs: np.ndarray) -> np.ndarray:
    """(obs − mean)/std clipped to ±5, float32 [B, obs_dim]."""
    return np.clip((obs - arrays[OBS_MEAN]) / arrays[OBS_STD], -OBS_CLIP, OBS_CLIP).astype(np.float32)


def mlp_forward(arrays: dict, x: np.ndarray, prefix: str = "policy") -> np.ndarray:
    """ReLU MLP on the layers `{prefix}/w{i}`, `{prefix}/b{i}`; no activation on the last one."""
    h, i = x, 0
    while f"{prefix}/w{i + 1}" in arrays:
        h = np.maximum(h @ arrays[f"{prefix}/w{i}"] + arrays[f"{prefix}/b{i}"], 0.0)
        i += 1
    return h @ arrays[f"{prefix}/w{i}"] + arrays[f"{prefix}/b{i}"]


def policy_mean(arrays: dict, obs: np.ndarray) -> np.ndarray:
    """Mean action of the Gaussian policy, float32 [B, action_dim] in [-1, 1].

    Hidden layers use ReLU, the mean head tanh (BatchPPO reference network).
    Args:
        arrays: named weights from the learner (see `layer_names`, OBS_MEAN, OBS_STD).
        obs: raw observations [B, obs_dim].
    """
    return np.tanh(mlp_forward(arrays, normalize_obs(arrays, obs)))


def sample_actions(arrays: dict, obs: np.ndarray, rng: np.random.Generator):
    """Samples actions from N(mean, exp(log_std)).

    Returns:
        (action [B, A], log_prob [B], mean [B, A], log_std [B, A]), all float32;
        `action` is the unclipped sample the log-prob refers to.
    """
    mean = policy_mean(arrays, obs).astype(np.float32)
    log_std = np.broadcast_to(arrays[LOG_STD], mean.shape).astype(np.float32)
    noise = rng.standard_normal(mean.shape).astype(np.float32)
    action = mean + np.exp(log_std) * noise
    log_prob = (-0.5 * noise ** 2 - log_std - 0.5 * np.log(2 * np.pi)).sum(-1)
    return action, log_prob.astype(np.float32), mean, log_std


def to_env_action(action: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Maps policy actions in [-1, 1] (clipped) linearly onto the env's Box [low, high]."""
    a = np.clip(action, -1.0, 1.0)
    return (low + (a + 1.0) * 0.5 * (high - low)).astype(np.float32)


EPSILON = "epsilon"  # DQN: the actors' current exploration rate, pushed with the weights


def epsilon_greedy(arrays: dict, obs: np.ndarray, rng: np.random.Generator, epsilon: float | None = None):
    """DQN behaviour policy: argmax_a Q(s, a) with probability 1 − ε, else a uniform action.

    Args:
        arrays: Q-network layers `q/w{i}`, `q/b{i}` and `epsilon` (used when `epsilon` is None).
        obs: [B, obs_dim] observations.
    Returns:
        int32 [B] actions.
    """
    q = mlp_forward(arrays, np.asarray(obs, np.float32), "q")
    eps = float(arrays[EPSILON]) if epsilon is None else epsilon
    greedy = q.argmax(-1)
    explore = rng.random(len(greedy)) < eps
    return np.where(explore, rng.integers(0, q.shape[-1], len(greedy)), greedy).astype(np.int32)
