"""BatchPPO's behaviour and evaluation policy as the actors run it: a diagonal Gaussian on an MLP, in numpy.

The learner's networks (`rlfleet.algorithms.ppo.networks`) export their variables under the names used here,
together with the observation normalizer's statistics, so actors, evaluation and the learner act alike.
"""

from __future__ import annotations

import numpy as np

from rlfleet.algorithms.library.policy import ACTIVATIONS, mlp_forward, scalar_code

OBS_MEAN, OBS_STD = "obs_norm/mean", "obs_norm/std"
OBS_CLIP = "obs_norm/clip"  # the learner's `obs_clip` setting, pushed with the weights
LOG_STD = "policy/log_std"
ACTIVATION = "policy/activation"  # hidden-layer activation: index into ACTIVATIONS
MEAN_HEAD, MEAN_HEADS = "policy/mean_head", ("tanh", "linear")  # mean = tanh(MLP) or MLP: index into MEAN_HEADS


def layer_names(i: int) -> tuple[str, str]:
    """Names of the kernel and bias of policy layer `i` (the last one is the mean head)."""
    return f"policy/w{i}", f"policy/b{i}"


def normalize_obs(arrays: dict, obs: np.ndarray) -> np.ndarray:
    """(obs − mean)/std clipped to ±clip, float32 [B, obs_dim].

    mean, std and clip all come with the weights (`OBS_MEAN`, `OBS_STD`,
    `OBS_CLIP`), so actors, evaluation and the learner normalise alike
    whatever the run's `obs_clip` setting (BatchPPO's reference value: 5).
    Raises:
        KeyError: weights from a learner that does not push the clip value.
    """
    clip = float(np.ravel(arrays[OBS_CLIP])[0])  # a scalar travels as a [1] array
    return np.clip((obs - arrays[OBS_MEAN]) / arrays[OBS_STD], -clip, clip).astype(np.float32)


def policy_mean(arrays: dict, obs: np.ndarray) -> np.ndarray:
    """Mean action of the Gaussian policy, float32 [B, action_dim] (in [-1, 1] with the tanh mean head).

    The hidden-layer activation and the mean head (BatchPPO's reference
    network: ReLU, tanh) come with the weights (`ACTIVATION`, `MEAN_HEAD`).
    Args:
        arrays: named weights from the learner (see `layer_names`, OBS_MEAN, OBS_STD, OBS_CLIP).
        obs: raw observations [B, obs_dim].
    """
    out = mlp_forward(arrays, normalize_obs(arrays, obs), "policy", ACTIVATIONS[scalar_code(arrays, ACTIVATION)])
    return np.tanh(out) if MEAN_HEADS[scalar_code(arrays, MEAN_HEAD)] == "tanh" else out


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
    log_prob = (-0.5 * noise**2 - log_std - 0.5 * np.log(2 * np.pi)).sum(-1)
    return action, log_prob.astype(np.float32), mean, log_std


def mean_env_action(arrays: dict, obs: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """The evaluation action: the Gaussian policy's mean on raw observations [B, obs_dim], mapped onto
    the env's Box [low, high] (BatchPPO evaluates with the mean action). float32 [B, action_dim]."""
    return to_env_action(policy_mean(arrays, obs), low, high)


def to_env_action(action: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Maps policy actions in [-1, 1] (clipped) linearly onto the env's Box [low, high]."""
    a = np.clip(action, -1.0, 1.0)
    return (low + (a + 1.0) * 0.5 * (high - low)).astype(np.float32)
