"""The learner's generic network pieces: an MLP in TensorFlow, its initialisers, and where TensorFlow runs them.

Each algorithm builds its networks from these (`rlfleet.algorithms.<name>.networks`) and exports their
variables in the layout its actor-side policy reads.
"""

from __future__ import annotations

import math
import os

import numpy as np
import tensorflow as tf

from rlfleet.algorithms.library.policy import ACTIVATIONS

INITS = ("variance_scaling", "orthogonal")
# Orthogonal initialisation's gain on hidden layers as CleanRL's PPO and Stable-Baselines3 set it ("The 37
# Implementation Details of Proximal Policy Optimization", detail 2): √2.
ORTHOGONAL_HIDDEN_GAIN = math.sqrt(2.0)


def dense_variables(fan_in: int, fan_out: int, scale: float, rng: np.random.Generator):
    """A variance-scaling (fan-in, uniform) initialised kernel [fan_in, fan_out] and a zero bias, float32
    variables."""
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
                w, bias = dense_variables(a, b, out_scale if last else (2.0 if activation == "relu" else 1.0), rng)
            self.kernels.append(w)
            self.biases.append(bias)

    def __call__(self, x):
        return dense_stack(x, self.kernels, self.biases, self.activation)


def dense_stack(x, kernels, biases, activation: str = "relu"):
    """x @ W + b through each layer, `activation` ("relu" or "tanh") on all but the last: [N, in] float32 ->
    [N, out] float32 (`MLP`; the exported policies run their layers with it too)."""
    act = tf.nn.relu if activation == "relu" else tf.tanh
    for i, (w, b) in enumerate(zip(kernels, biases)):
        x = tf.matmul(x, w) + b
        if i < len(kernels) - 1:
            x = act(x)
    return x


def frozen(array) -> tf.Variable:
    """A float32 variable of `array` that no optimizer trains (the weights of an exported policy)."""
    return tf.Variable(np.asarray(array, np.float32), trainable=False)


def compute_device() -> str:
    """Where TensorFlow runs the learner's networks, in words: TensorFlow places every op on the first GPU it sees
    (the image or install with the `gpu` extra, an NVIDIA driver, and for a container a GPU given to it), else on
    the CPU."""
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        build = "a CPU-only TensorFlow build" if not tf.test.is_built_with_cuda() else "no GPU visible to TensorFlow"
        return f"networks on the CPU ({build}; {os.cpu_count()} cores)"
    name = tf.config.experimental.get_device_details(gpus[0]).get("device_name", "unknown")
    more = f"; {len(gpus) - 1} more GPU(s) unused" if len(gpus) > 1 else ""
    return f"networks on {gpus[0].name.replace('/physical_device:', '')} ({name}{more})"
