"""Policy and value networks of BatchPPO (separate MLPs, reference config).

Reference network (BatchPPO configs): two hidden layers (200, 100) with ReLU
for both policy and value; the policy mean goes through tanh, its output layer
is initialised with a variance-scaling factor of 0.1, and the state-independent
standard deviation starts at 0.35.
"""
from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from actors.policy import LOG_STD, layer_names


def _dense(fan_in: int, fan_out: int, scale: float, rng: np.random.Generator):
    limit = math.sqrt(3.0 * scale / fan_in)  # variance scaling, fan_in, uniform
    w = rng.uniform(-limit, limit, size=(fan_in, fan_out)).astype(np.float32)
    return tf.Variable(w), tf.Variable(np.zeros(fan_out, np.float32))


class MLP(tf.Module):
    """ReLU MLP: [N, in] float32 -> [N, out] float32 (no output activation)."""

    def __init__(self, sizes: list[int], out_scale: float, seed: int, name: str):
        super().__init__(name=name)
        rng = np.random.default_rng(seed)
        self.kernels, self.biases = [], []
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            last = i == len(sizes) - 2
            w, bias = _dense(a, b, out_scale if last else 2.0, rng)
            self.kernels.append(w)
            self.biases.append(bias)

    def __call__(self, x):
        for i, (w, b) in enumerate(zip(self.kernels, self.biases)):
            x = tf.matmul(x, w) + b
            if i < len(self.kernels) - 1:
                x = tf.nn.relu(x)
        return x


class GaussianPolicy(tf.Module):
    """Diagonal Gaussian policy with tanh mean and state-independent log-std.

    Call: normalised observations [N, obs_dim] float32 -> (mean [N, A], log_std [N, A]).
    """

    def __init__(self, obs_dim: int, action_dim: int, hidden: list[int], init_std: float = 0.35,
                 mean_init_factor: float = 0.1, seed: int = 0):
        super().__init__(name="policy")
        self.mlp = MLP([obs_dim, *hidden, action_dim], mean_init_factor, seed, "policy_mlp")
        self.log_std = tf.Variable(np.full(action_dim, math.log(init_std), np.float32))

    def __call__(self, obs):
        mean = tf.tanh(self.mlp(obs))
        return mean, tf.broadcast_to(self.log_std, tf.shape(mean))

    def export(self) -> dict:
        """Named numpy arrays in the layout `actors.policy` reads."""
        out = {LOG_STD: self.log_std.numpy()}
        for i, (w, b) in enumerate(zip(self.mlp.kernels, self.mlp.biases)):
            wn, bn = layer_names(i)
            out[wn], out[bn] = w.numpy(), b.numpy()
        return out


class ValueNetwork(tf.Module):
    """State-value MLP: normalised observations [N, obs_dim] -> values [N] float32."""

    def __init__(self, obs_dim: int, hidden: list[int], seed: int = 1):
        super().__init__(name="value")
        self.mlp = MLP([obs_dim, *hidden, 1], 1.0, seed, "value_mlp")

    def __call__(self, obs):
        return self.mlp(obs)[:, 0]
