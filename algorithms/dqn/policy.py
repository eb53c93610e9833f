"""DQN's behaviour and evaluation policy as the actors run it: ε-greedy on the pushed Q-network.

A vector env's MLP Q-network runs as plain numpy; the Nature CNN Q-network for Atari is one `tf.function` call
(convolutions in numpy would cost far more). `nature_cnn_q` is the one definition of the CNN that both the
learner (`rlfleet.algorithms.dqn.networks`) and the actors run. TensorFlow is imported only when a CNN runs, so
that an actor of a vector env never loads TensorFlow's Python.
"""

from __future__ import annotations

import numpy as np

from rlfleet.algorithms.library.policy import mlp_forward

CONV_STRIDES = (4, 2, 1)  # Nature CNN (Mnih et al. 2015): 32 8x8/4, 64 4x4/2, 64 3x3/1, then 512 units


def conv_names(i: int) -> tuple[str, str]:
    """Names of the kernel [h, w, in, out] and bias of Q-network convolution `i`."""
    return f"q/conv{i}/w", f"q/conv{i}/b"


def nature_cnn_q(frames, conv_kernels, conv_biases, kernels, biases):
    """Q-values of the Nature DQN network (Mnih et al. 2015; the reincarnating_rl student and teacher).

    Args:
        frames: uint8 [B, S, H, W] stacked grayscale frames (oldest first), scaled by 1/255 here.
        conv_kernels / conv_biases: 3 kernels [h, w, in, out] and biases [out] (strides 4, 2, 1, VALID, ReLU).
        kernels / biases: dense layers (ReLU on all but the last); the last has one unit per action.
            All weights float32 (what the learner trains and pushes) or all bfloat16: the arithmetic runs in
            their dtype.
    Returns:
        float32 [B, num_actions].
    """
    import tensorflow as tf

    x = tf.transpose(tf.cast(frames, conv_kernels[0].dtype) / 255.0, [0, 2, 3, 1])
    for w, b, stride in zip(conv_kernels, conv_biases, CONV_STRIDES):
        x = tf.nn.relu(tf.nn.conv2d(x, w, stride, "VALID") + b)
    x = tf.reshape(x, [tf.shape(x)[0], -1])
    for i, (w, b) in enumerate(zip(kernels, biases)):
        x = tf.matmul(x, w) + b
        if i < len(kernels) - 1:
            x = tf.nn.relu(x)
    return tf.cast(x, tf.float32)


# The actors' compiled CNN, and (the arrays dict its weight tensors were made from, the tensors): converted once
# per version.
_cnn: dict = {"function": None, "weights": (None, None)}


def q_values(arrays: dict, obs: np.ndarray) -> np.ndarray:
    """Q(s, ·) of the pushed Q-network: float32 [B, num_actions].

    Args:
        arrays: an MLP (`q/w{i}`, `q/b{i}`) or, with `q/conv{i}/*`, the Nature CNN.
        obs: [B, obs_dim] vectors, or uint8 [B, S, 84, 84] frames for the CNN.
    """
    if conv_names(0)[0] not in arrays:
        return mlp_forward(arrays, np.asarray(obs, np.float32), "q")
    import tensorflow as tf

    if _cnn["function"] is None:
        _cnn["function"] = tf.function(nature_cnn_q)
    made_from, tensors = _cnn["weights"]
    if made_from is not arrays:
        n_conv = len(CONV_STRIDES)
        n_dense = sum(1 for k in arrays if k.startswith("q/w"))
        tensors = [[tf.constant(arrays[conv_names(i)[j]]) for i in range(n_conv)] for j in (0, 1)] + [
            [tf.constant(arrays[f"q/{p}{i}"]) for i in range(n_dense)] for p in ("w", "b")
        ]
        _cnn["weights"] = (arrays, tensors)
    return _cnn["function"](tf.constant(obs), *tensors).numpy()


def epsilon_greedy(arrays: dict, obs: np.ndarray, rng: np.random.Generator, epsilon: float):
    """DQN behaviour policy: argmax_a Q(s, a) with probability 1 − ε, else a uniform action.

    Args:
        arrays: Q-network weights (see `q_values`).
        obs: [B, obs_dim] observations (uint8 [B, S, 84, 84] frames for the CNN).
        epsilon: ε in [0, 1] (actors: the `Exploration` the learner published with the weights).
    Returns:
        int32 [B] actions.
    """
    return epsilon_greedy_q(q_values(arrays, obs), rng, epsilon)


def epsilon_greedy_q(q: np.ndarray, rng: np.random.Generator, epsilon: float) -> np.ndarray:
    """`epsilon_greedy` on Q-values already computed: q [B, actions] -> int32 [B] actions."""
    greedy = q.argmax(-1)
    explore = rng.random(len(greedy)) < epsilon
    return np.where(explore, rng.integers(0, q.shape[-1], len(greedy)), greedy).astype(np.int32)
