"""DQN's Q-networks: an MLP for vector observations, the Nature CNN or the Impala CNN for Atari frames."""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from rlfleet.algorithms.dqn.config import CNNS, DQNConfig, network_problem
from rlfleet.algorithms.dqn.policy import (
    CONV_STRIDES,
    IMPALA_CHANNELS,
    IMPALA_HIDDEN,
    NATURE_HIDDEN,
    cnn_q,
    conv_names,
)
from rlfleet.algorithms.library.networks import MLP, dense_variables
from rlfleet.envs.core import EnvSpec


def _conv_layers(kind: str, frame_stack: int, frame_shape: tuple) -> tuple[list, int]:
    """The convolutions of the CNN `kind` as (kernel size, in channels, out channels) in the order its weights
    are kept (`rlfleet.algorithms.dqn.policy`), and the size of its flattened features."""
    h, w = frame_shape
    if kind == "nature_cnn":
        layers, channels = [], frame_stack
        for (out, k), stride in zip(((32, 8), (64, 4), (64, 3)), CONV_STRIDES):
            layers.append((k, channels, out))
            h, w, channels = (h - k) // stride + 1, (w - k) // stride + 1, out
        return layers, h * w * channels
    layers, channels = [], frame_stack
    for out in IMPALA_CHANNELS:
        layers += [(3, channels, out)] + [(3, out, out)] * 4  # the stack's convolution, two residual blocks
        h, w, channels = -(-h // 2), -(-w // 2), out  # the max-pool of stride 2, SAME
    return layers, h * w * channels


class CNN(tf.Module):
    """An Atari CNN Q-network: the Nature CNN (Mnih et al. 2015; reincarnating_rl's DQN teachers and students) or
    the Impala CNN (Espeholt et al. 2018; reincarnating_rl's and CleanRL's Impala-CNN students).

    Call: uint8 frames [N, S, H, W] -> Q-values [N, num_actions] float32 (`rlfleet.algorithms.dqn.policy.cnn_q`).
    Nature: convolutions 32 8x8/4, 64 4x4/2, 64 3x3/1 and 512 units; Impala: `IMPALA_CHANNELS` stacks and 256
    units. Convolutions and hidden units ReLU; the Nature CNN's convolutions He-uniform, the Impala CNN's
    LeCun-uniform, hidden layers He-uniform, the output layer variance scaling 1.

    Args:
        kind: "nature_cnn" or "impala_cnn".
    """

    def __init__(self, kind: str, frame_stack: int, frame_shape: tuple, num_actions: int, seed: int, name: str):
        super().__init__(name=name)
        rng = np.random.default_rng(seed)
        layers, features = _conv_layers(kind, frame_stack, frame_shape)
        self.conv_kernels, self.conv_biases = [], []
        # He-uniform for the Nature CNN's plain ReLU stack; LeCun-uniform (variance scale 1, Flax's default, which
        # reincarnating_rl's Impala network keeps inside its blocks) for the Impala CNN, whose six residual blocks
        # would each double the signal's variance at He's scale and start the Q-values far from 0.
        scale = 2.0 if kind == "nature_cnn" else 1.0
        for k, channels, out in layers:
            limit = math.sqrt(3.0 * scale / (k * k * channels))
            self.conv_kernels.append(tf.Variable(rng.uniform(-limit, limit, (k, k, channels, out)).astype(np.float32)))
            self.conv_biases.append(tf.Variable(np.zeros(out, np.float32)))
        hidden = NATURE_HIDDEN if kind == "nature_cnn" else IMPALA_HIDDEN
        self.kernels, self.biases = [], []
        for i, (a, b) in enumerate(((features, hidden), (hidden, num_actions))):
            kernel, bias = dense_variables(a, b, 1.0 if i else 2.0, rng)
            self.kernels.append(kernel)
            self.biases.append(bias)

    def __call__(self, frames):
        return cnn_q(frames, self.conv_kernels, self.conv_biases, self.kernels, self.biases)

    def export(self) -> dict:
        """Named numpy arrays in the layout `rlfleet.algorithms.dqn.policy.q_values` reads."""
        out = {}
        for i, (w, b) in enumerate(zip(self.conv_kernels, self.conv_biases)):
            wn, bn = conv_names(i)
            out[wn], out[bn] = w.numpy(), b.numpy()
        for i, (w, b) in enumerate(zip(self.kernels, self.biases)):
            out[f"q/w{i}"], out[f"q/b{i}"] = w.numpy(), b.numpy()
        return out


def network_kind(spec: EnvSpec, network: str) -> str:
    """The Q-network `network` (a `DQNConfig.network` choice) stands for on `spec`'s env: "auto" is the Nature CNN
    on stacked frames (Atari), else the MLP.

    Raises:
        ValueError: a CNN for vector observations, or the MLP for frames.
    """
    frames = spec.frame_stack > 1
    problem = network_problem(network, frames, spec.env_id)
    if problem:
        raise ValueError(problem)
    return ("nature_cnn" if frames else "mlp") if network == "auto" else network


def make_q_network(spec: EnvSpec, config: DQNConfig, seed: int, name: str):
    """Q-network for `spec` as `config.network` chooses it (`network_kind`): a CNN on stacked frames (Atari), else
    an MLP with `config.hidden`. Either maps observations [N, *spec.obs_shape] to Q-values [N, spec.action_dim]
    float32.

    Raises:
        ValueError: a network that does not fit the env's observations (`network_kind`).
    """
    kind = network_kind(spec, getattr(config, "network", "auto"))
    if kind in CNNS:
        return CNN(kind, spec.frame_stack, spec.frame_shape, spec.action_dim, seed, name)
    return MLP([spec.obs_shape[0], *config.hidden, spec.action_dim], 1.0, seed, name)


def export_q(net) -> dict:
    """Named numpy arrays of a Q-network in the layout `rlfleet.algorithms.dqn.policy.q_values` reads."""
    if isinstance(net, CNN):
        return net.export()
    out = {}
    for i, (w, b) in enumerate(zip(net.kernels, net.biases)):
        out[f"q/w{i}"], out[f"q/b{i}"] = w.numpy(), b.numpy()
    return out
