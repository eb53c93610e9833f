"""BatchPPO's policy and value networks (separate MLPs).

Reference network (BatchPPO configs): two hidden layers (200, 100) with ReLU for both policy and value; the
policy mean goes through tanh, its output layer is initialised with a variance-scaling factor of 0.1, and the
state-independent standard deviation starts at 0.35. The `default` and `cleanrl` presets choose tanh (64, 64)
MLPs with a linear mean head instead (`rlfleet.algorithms.ppo.config`).
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from rlfleet.algorithms.library.networks import MLP
from rlfleet.algorithms.library.policy import ACTIVATIONS
from rlfleet.algorithms.ppo.policy import ACTIVATION, LOG_STD, MEAN_HEAD, MEAN_HEADS, layer_names

# Orthogonal initialisation's head gains as CleanRL's PPO and Stable-Baselines3 set them ("The 37 Implementation
# Details of Proximal Policy Optimization", detail 2): 0.01 on the policy's mean head, 1 on the value head.
ORTHOGONAL_POLICY_HEAD_GAIN = 0.01
ORTHOGONAL_VALUE_HEAD_GAIN = 1.0


class GaussianPolicy(tf.Module):
    """Diagonal Gaussian policy with a state-independent log-std.

    Call: normalised observations [N, obs_dim] float32 -> (mean [N, A], log_std [N, A]).
    The mean is tanh(MLP(obs)) (`mean_head` "tanh", the BatchPPO network) or
    the MLP's output itself ("linear", as in Stable-Baselines3 and CleanRL).
    With `init` "orthogonal" the mean head's gain is 0.01 (CleanRL) and
    `mean_init_factor` is not used.

    Args:
        obs_dim, action_dim: sizes of the observation and action vectors.
        config: the network's settings (a `PPOConfig`): policy_hidden (hidden layer widths), init_std (the
            initial standard deviation), mean_init_factor, activation, mean_head and init.
        seed: initialisation seed.
    Raises:
        ValueError: an unknown mean head.
    """

    def __init__(self, obs_dim: int, action_dim: int, config, seed: int = 0):
        super().__init__(name="policy")
        if config.mean_head not in MEAN_HEADS:
            raise ValueError(f"mean_head {config.mean_head!r}: choose one of {MEAN_HEADS}")
        self.mean_head = config.mean_head
        head = ORTHOGONAL_POLICY_HEAD_GAIN if config.init == "orthogonal" else config.mean_init_factor
        layers = [obs_dim, *config.policy_hidden, action_dim]
        self.mlp = MLP(layers, head, seed, "policy_mlp", config.activation, config.init)
        self.log_std = tf.Variable(np.full(action_dim, math.log(config.init_std), np.float32))

    def __call__(self, obs):
        mean = self.mlp(obs)
        if self.mean_head == "tanh":
            mean = tf.tanh(mean)
        return mean, tf.broadcast_to(self.log_std, tf.shape(mean))

    def export(self) -> dict:
        """Named numpy arrays in the layout `rlfleet.algorithms.ppo.policy` reads (the layer structure, activation
        and mean head travel with them)."""
        out = {
            LOG_STD: self.log_std.numpy(),
            ACTIVATION: np.float32(ACTIVATIONS.index(self.mlp.activation)),
            MEAN_HEAD: np.float32(MEAN_HEADS.index(self.mean_head)),
        }
        for i, (w, b) in enumerate(zip(self.mlp.kernels, self.mlp.biases)):
            wn, bn = layer_names(i)
            out[wn], out[bn] = w.numpy(), b.numpy()
        return out


class ValueNetwork(tf.Module):
    """State-value MLP: normalised observations [N, obs_dim] -> values [N] float32 (output layer: scale or
    gain 1 under either `init`)."""

    def __init__(
        self, obs_dim: int, hidden: list[int], seed: int = 1, activation: str = "relu", init: str = "variance_scaling"
    ):
        super().__init__(name="value")
        self.mlp = MLP([obs_dim, *hidden, 1], ORTHOGONAL_VALUE_HEAD_GAIN, seed, "value_mlp", activation, init)

    def __call__(self, obs):
        return self.mlp(obs)[:, 0]
