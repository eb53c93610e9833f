"""DQN's Q-networks: an MLP for vector observations, the Nature CNN for Atari frames."""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from rlfleet.algorithms.dqn.config import DQNConfig
from rlfleet.algorithms.dqn.policy import CONV_STRIDES, conv_names, nature_cnn_q
from rlfleet.algorithms.library.networks import MLP, dense_variables
from rlfleet.envs.core import EnvSpec


class NatureCNN(tf.Module):
    """The Nature DQN Q-network (Mnih et al. 2015), as the reincarnating_rl student and teacher use it.

    Call: uint8 frames [N, S, 84, 84] -> Q-values [N, num_actions] float32
    (`rlfleet.algorithms.dqn.policy.nature_cnn_q`). Convolutions 32 8x8/4, 64 4x4/2, 64 3x3/1
    and a 512-unit layer, all ReLU, He-uniform initialised; the output layer
    uses variance scaling 1.
    """

    def __init__(self, frame_stack: int, frame_shape: tuple, num_actions: int, seed: int, name: str):
        super().__init__(name=name)
        rng = np.random.default_rng(seed)
        self.conv_kernels, self.conv_biases = [], []
        h, w = frame_shape
        channels = frame_stack
        for (out, k), stride in zip(((32, 8), (64, 4), (64, 3)), CONV_STRIDES):
            limit = math.sqrt(3.0 * 2.0 / (k * k * channels))
            self.conv_kernels.append(tf.Variable(rng.uniform(-limit, limit, (k, k, channels, out)).astype(np.float32)))
            self.conv_biases.append(tf.Variable(np.zeros(out, np.float32)))
            h, w, channels = (h - k) // stride + 1, (w - k) // stride + 1, out
        self.kernels, self.biases = [], []
        for i, (a, b) in enumerate(((h * w * channels, 512), (512, num_actions))):
            kernel, bias = dense_variables(a, b, 1.0 if i else 2.0, rng)
            self.kernels.append(kernel)
            self.biases.append(bias)

    def __call__(self, frames):
        return nature_cnn_q(frames, self.conv_kernels, self.conv_biases, self.kernels, self.biases)

    def export(self) -> dict:
        """Named numpy arrays in the layout `rlfleet.algorithms.dqn.policy.q_values` reads."""
        out = {}
        for i, (w, b) in enumerate(zip(self.conv_kernels, self.conv_biases)):
            wn, bn = conv_names(i)
            out[wn], out[bn] = w.numpy(), b.numpy()
        for i, (w, b) in enumerate(zip(self.kernels, self.biases)):
            out[f"q/w{i}"], out[f"q/b{i}"] = w.numpy(), b.numpy()
        return out


def make_q_network(spec: EnvSpec, config: DQNConfig, seed: int, name: str):
    """Q-network for `spec`: the Nature CNN on stacked frames (Atari), else an MLP with `config.hidden`.

    Either maps observations [N, *spec.obs_shape] to Q-values [N, spec.action_dim] float32.
    """
    if spec.frame_stack > 1:
        return NatureCNN(spec.frame_stack, spec.frame_shape, spec.action_dim, seed, name)
    return MLP([spec.obs_shape[0], *config.hidden, spec.action_dim], 1.0, seed, name)


def export_q(net) -> dict:
    """Named numpy arrays of a Q-network in the layout `rlfleet.algorithms.dqn.policy.q_values` reads."""
    if isinstance(net, NatureCNN):
        return net.export()
    out = {}
    for i, (w, b) in enumerate(zip(net.kernels, net.biases)):
        out[f"q/w{i}"], out[f"q/b{i}"] = w.numpy(), b.numpy()
    return out
