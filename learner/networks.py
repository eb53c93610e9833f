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

from rlfleet.actors.policy import (
    ACTIVATION,
    ACTIVATIONS,
    CONV_STRIDES,
    LOG_STD,
    MEAN_HEAD,
    MEAN_HEADS,
    conv_names,
    layer_names,
    nature_cnn_q,
)

INITS = ("variance_scaling", "orthogonal")
# Orthogonal initialisation's gains as CleanRL's PPO and Stable-Baselines3 set them ("The 37 Implementation Details
# of Proximal Policy Optimization", detail 2): √2 on hidden layers, 0.01 on the policy's mean head, 1 on the value head.
ORTHOGONAL_HIDDEN_GAIN = math.sqrt(2.0)
ORTHOGONAL_POLICY_HEAD_GAIN = 0.01
ORTHOGONAL_VALUE_HEAD_GAIN = 1.0


def _dense(fan_in: int, fan_out: int, scale: float, rng: np.random.Generator):
    limit = math.sqrt(3.0 * scale / fan_in)  # variance scaling, fan_in, uniform
    w = rng.uniform(-limit, limit, size=(fan_in, fan_out)).astype(np.float32)
    return tf.Variable(w), tf.Variable(np.zeros(fan_out, np.float32))


def orthogonal(fan_in: int, fan_out: int, gain: float, rng: np.random.Generator) -> np.ndarray:
    """A [fan_in, fan_out] float32 matrix with orthonormal rows or columns (whichever are fewer), times `gain`.

    The Q factor of a Gaussian matrix's QR decomposition, its columns' signs fixed by R's diagonal so that
    the result is uniformly distributed (Saxe et al. 2014, "Exact solutions to the nonlinear dynamics of
    learning in deep linear neural networks").
    """
    a = rng.standard_normal((max(fan_in, fan_out), min(fan_in, fan_out)))
    q, r = np.linalg.qr(a)
    q = q * np.sign(np.diag(r))
    if fan_in < fan_out:
        q = q.T
    return (gain * q).astype(np.float32)


class MLP(tf.Module):
    """MLP: [N, in] float32 -> [N, out] float32, `activation` ("relu" or "tanh") on hidden layers only.

    `init` "variance_scaling": hidden layers variance-scaling initialised
    (scale 2 for ReLU, 1 for tanh), the output layer with scale `out_scale`;
    "orthogonal": orthogonal kernels with gain √2 on hidden layers and
    `out_scale` as the output layer's gain. Biases start at 0.
    Raises:
        ValueError: unknown activation or init.
    """

    def __init__(
        self,
        sizes: list[int],
        out_scale: float,
        seed: int,
        name: str,
        activation: str = "relu",
        init: str = "variance_scaling",
    ):
        super().__init__(name=name)
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation {activation!r}: choose one of {ACTIVATIONS}")
        if init not in INITS:
            raise ValueError(f"init {init!r}: choose one of {INITS}")
        self.activation = activation
        rng = np.random.default_rng(seed)
        self.kernels, self.biases = [], []
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            last = i == len(sizes) - 2
            if init == "orthogonal":
                gain = out_scale if last else ORTHOGONAL_HIDDEN_GAIN
                w, bias = tf.Variable(orthogonal(a, b, gain, rng)), tf.Variable(np.zeros(b, np.float32))
            else:
                w, bias = _dense(a, b, out_scale if last else (2.0 if activation == "relu" else 1.0), rng)
            self.kernels.append(w)
            self.biases.append(bias)

    def __call__(self, x):
        act = tf.nn.relu if self.activation == "relu" else tf.tanh
        for i, (w, b) in enumerate(zip(self.kernels, self.biases)):
            x = tf.matmul(x, w) + b
            if i < len(self.kernels) - 1:
                x = act(x)
        return x


class GaussianPolicy(tf.Module):
    """Diagonal Gaussian policy with a state-independent log-std.

    Call: normalised observations [N, obs_dim] float32 -> (mean [N, A], log_std [N, A]).
    The mean is tanh(MLP(obs)) (`mean_head` "tanh", the BatchPPO network) or
    the MLP's output itself ("linear", as in Stable-Baselines3 and CleanRL).
    With `init` "orthogonal" the mean head's gain is 0.01 (CleanRL) and
    `mean_init_factor` is not used.
    """

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        hidden: list[int],
        init_std: float = 0.35,
        mean_init_factor: float = 0.1,
        seed: int = 0,
        activation: str = "relu",
        mean_head: str = "tanh",
        init: str = "variance_scaling",
    ):
        super().__init__(name="policy")
        if mean_head not in MEAN_HEADS:
            raise ValueError(f"mean_head {mean_head!r}: choose one of {MEAN_HEADS}")
        self.mean_head = mean_head
        head = ORTHOGONAL_POLICY_HEAD_GAIN if init == "orthogonal" else mean_init_factor
        self.mlp = MLP([obs_dim, *hidden, action_dim], head, seed, "policy_mlp", activation, init)
        self.log_std = tf.Variable(np.full(action_dim, math.log(init_std), np.float32))

    def __call__(self, obs):
        mean = self.mlp(obs)
        if self.mean_head == "tanh":
            mean = tf.tanh(mean)
        return mean, tf.broadcast_to(self.log_std, tf.shape(mean))

    def export(self) -> dict:
        """Named numpy arrays in the layout `rlfleet.actors.policy` reads (the layer structure, activation and mean
        head travel with them)."""
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


class NatureCNN(tf.Module):
    """The Nature DQN Q-network (Mnih et al. 2015), as the reincarnating_rl student and teacher use it.

    Call: uint8 frames [N, S, 84, 84] -> Q-values [N, num_actions] float32
    (`rlfleet.actors.policy.nature_cnn_q`). Convolutions 32 8x8/4, 64 4x4/2, 64 3x3/1
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
            kernel, bias = _dense(a, b, 1.0 if i else 2.0, rng)
            self.kernels.append(kernel)
            self.biases.append(bias)

    def __call__(self, frames):
        return nature_cnn_q(frames, self.conv_kernels, self.conv_biases, self.kernels, self.biases)

    def export(self) -> dict:
        """Named numpy arrays in the layout `rlfleet.actors.policy.q_values` reads."""
        out = {}
        for i, (w, b) in enumerate(zip(self.conv_kernels, self.conv_biases)):
            wn, bn = conv_names(i)
            out[wn], out[bn] = w.numpy(), b.numpy()
        for i, (w, b) in enumerate(zip(self.kernels, self.biases)):
            out[f"q/w{i}"], out[f"q/b{i}"] = w.numpy(), b.numpy()
        return out
