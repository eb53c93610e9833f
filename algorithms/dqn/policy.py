"""DQN's behaviour and evaluation policy as the actors run it: ε-greedy on the pushed Q-network.

A vector env's MLP Q-network runs as plain numpy; an Atari CNN Q-network (the Nature CNN, or the Impala CNN) is
one `tf.function` call (convolutions in numpy would cost far more). `cnn_q` is the one definition of the CNNs that
the learner (`rlfleet.algorithms.dqn.networks`), the actors and the exported policy run; the weights say which
CNN they are by their number of convolutions. TensorFlow is imported only when a CNN runs, so
that an actor of a vector env never loads TensorFlow's Python.
"""

from __future__ import annotations

import threading

import numpy as np

from rlfleet.algorithms.library.policy import mlp_forward

CONV_STRIDES = (4, 2, 1)  # Nature CNN (Mnih et al. 2015): 32 8x8/4, 64 4x4/2, 64 3x3/1, then 512 units
NATURE_HIDDEN = 512
# Impala CNN (Espeholt et al. 2018, Fig. 3 "large"): per stack of `IMPALA_CHANNELS`, a 3x3 convolution, a 3x3
# max-pool of stride 2 and two residual blocks of two 3x3 convolutions each; then 256 units, as CleanRL's
# qdagger_dqn_atari_impalacnn has it (reincarnating_rl's impala_networks: 512). TensorFlow's SAME pooling pads
# the bottom and right edges where PyTorch pads every edge: the sizes agree, the windows are one pixel apart.
IMPALA_CHANNELS = (16, 32, 32)
IMPALA_CONVS = 5 * len(IMPALA_CHANNELS)
IMPALA_HIDDEN = 256


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

    x = _frames(frames, conv_kernels[0].dtype)
    for w, b, stride in zip(conv_kernels, conv_biases, CONV_STRIDES):
        x = tf.nn.relu(tf.nn.conv2d(x, w, stride, "VALID") + b)
    return _dense_head(x, kernels, biases)


def impala_cnn_q(frames, conv_kernels, conv_biases, kernels, biases):
    """Q-values of the Impala CNN (Espeholt et al. 2018; the reincarnating_rl and CleanRL Impala-CNN students).

    Args:
        frames: uint8 [B, S, H, W] stacked grayscale frames (oldest first), scaled by 1/255 here.
        conv_kernels / conv_biases: `IMPALA_CONVS` kernels [3, 3, in, out] and biases [out], stack by stack: the
            stack's convolution, then its two residual blocks' two convolutions each (stride 1, SAME).
        kernels / biases: dense layers, ReLU on the flattened features and on all but the last layer; the last
            has one unit per action. Weights float32 or bfloat16, as `nature_cnn_q`'s.
    Returns:
        float32 [B, num_actions].
    """
    import tensorflow as tf

    x = _frames(frames, conv_kernels[0].dtype)
    convs = iter(zip(conv_kernels, conv_biases))

    def conv(x):
        w, b = next(convs)
        return tf.nn.conv2d(x, w, 1, "SAME") + b

    for _ in IMPALA_CHANNELS:
        x = tf.nn.max_pool2d(conv(x), 3, 2, "SAME")
        for _ in range(2):  # residual blocks: x + conv(relu(conv(relu(x))))
            x = x + conv(tf.nn.relu(conv(tf.nn.relu(x))))
    return _dense_head(tf.nn.relu(x), kernels, biases)


def cnn_q(frames, conv_kernels, conv_biases, kernels, biases):
    """Q-values of the CNN whose weights these are: the Impala CNN with `IMPALA_CONVS` convolutions, else the
    Nature CNN (arguments and result as `nature_cnn_q`'s)."""
    q = impala_cnn_q if len(conv_kernels) == IMPALA_CONVS else nature_cnn_q
    return q(frames, conv_kernels, conv_biases, kernels, biases)


def _frames(frames, dtype):
    """uint8 frames [B, S, H, W] as [B, H, W, S] in [0, 1], of `dtype`."""
    import tensorflow as tf

    return tf.transpose(tf.cast(frames, dtype) / 255.0, [0, 2, 3, 1])


def _dense_head(x, kernels, biases):
    """Flattens the features x [B, h, w, c] and applies the dense layers (ReLU on all but the last): float32
    [B, num_actions]."""
    import tensorflow as tf

    x = tf.reshape(x, [tf.shape(x)[0], -1])
    for i, (w, b) in enumerate(zip(kernels, biases)):
        x = tf.matmul(x, w) + b
        if i < len(kernels) - 1:
            x = tf.nn.relu(x)
    return tf.cast(x, tf.float32)


def conv_count(arrays: dict) -> int:
    """The number of convolutions of a Q-network's exported weights (0: an MLP)."""
    return sum(1 for k in arrays if k.startswith("q/conv") and k.endswith("/w"))


# The actors' compiled CNN, and the weight tensors of the last `_CNN_WEIGHTS` arrays dicts it was called with
# (the student's and a JSRL guide's), each converted once per version: {id(arrays): (arrays, tensors)}; threads
# (an actor's envs, the learner's evaluations and videos) take the lock to change it.
_cnn: dict = {"function": None, "weights": {}}
_CNN_WEIGHTS = 2
_cnn_lock = threading.Lock()


def q_values(arrays: dict, obs: np.ndarray) -> np.ndarray:
    """Q(s, ·) of the pushed Q-network: float32 [B, num_actions].

    Args:
        arrays: an MLP (`q/w{i}`, `q/b{i}`) or, with `q/conv{i}/*`, a CNN (`cnn_q`).
        obs: [B, obs_dim] vectors, or uint8 [B, S, 84, 84] frames for the CNN.
    """
    if conv_names(0)[0] not in arrays:
        return mlp_forward(arrays, np.asarray(obs, np.float32), "q")
    import tensorflow as tf

    with _cnn_lock:
        if _cnn["function"] is None:
            _cnn["function"] = tf.function(cnn_q)
        made_from, tensors = _cnn["weights"].get(id(arrays), (None, None))
        if made_from is not arrays:
            n_conv = conv_count(arrays)
            n_dense = sum(1 for k in arrays if k.startswith("q/w"))
            tensors = [[tf.constant(arrays[conv_names(i)[j]]) for i in range(n_conv)] for j in (0, 1)] + [
                [tf.constant(arrays[f"q/{p}{i}"]) for i in range(n_dense)] for p in ("w", "b")
            ]
            while len(_cnn["weights"]) >= _CNN_WEIGHTS:
                _cnn["weights"].pop(next(iter(_cnn["weights"])))
            _cnn["weights"][id(arrays)] = (arrays, tensors)
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
