"""The behaviour policy as the actors run it: plain numpy on pushed weights.

A 200-100 MLP on a batch of 16 costs ~20 µs as numpy matrix products against
~0.4 ms per `tf.function` call (ARCHITECTURE.md), so actors do not run
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


def policy_mean(arrays: dict, obs: np.ndarray) -> np.ndarray:
    """Mean action of the Gaussian policy, float32 [B, action_dim] in [-1, 1].

    Hidden layers use ReLU, the mean head tanh (BatchPPO reference network).
    Args:
        arrays: named weights from the learner (see `layer_names`, OBS_MEAN, OBS_STD).
        obs: raw observations [B, obs_dim].
    """
    h = normalize_obs(arrays, obs)
    i = 0
    while layer_names(i + 1)[0] in arrays:
        w, b = layer_names(i)
        h = np.maximum(h @ arrays[w] + arrays[b], 0.0)
        i += 1
    w, b = layer_names(i)
    return np.tanh(h @ arrays[w] + arrays[b])


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
