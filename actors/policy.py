"""The behaviour policy as the actors run it, on weights pushed by the learner.

MLPs run as plain numpy: a 200-100 MLP on a batch of 16 costs ~20 µs as
numpy matrix products against ~0.4 ms per `tf.function` call (measured on the
2-core development machine). The Nature CNN Q-network for Atari is one
`tf.function` call (convolutions in numpy would cost far more). The learner's
networks (`rlfleet.learner.networks`) export their variables under the names used here,
together with the observation normalizer; `nature_cnn_q` is the one definition
of the CNN that both the learner and the actors run.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

OBS_MEAN, OBS_STD = "obs_norm/mean", "obs_norm/std"
OBS_CLIP = "obs_norm/clip"  # the learner's `obs_clip` setting, pushed with the weights
LOG_STD = "policy/log_std"
ACTIVATION, ACTIVATIONS = "policy/activation", ("relu", "tanh")  # hidden-layer activation: index into ACTIVATIONS
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


def _code(arrays: dict, key: str) -> int:
    return int(np.ravel(arrays[key])[0])


def mlp_forward(arrays: dict, x: np.ndarray, prefix: str = "policy", activation: str = "relu") -> np.ndarray:
    """MLP on the layers `{prefix}/w{i}`, `{prefix}/b{i}`: `activation` ("relu" or "tanh") on all but the last."""
    act = np.tanh if activation == "tanh" else (lambda z: np.maximum(z, 0.0))
    h, i = x, 0
    while f"{prefix}/w{i + 1}" in arrays:
        h = act(h @ arrays[f"{prefix}/w{i}"] + arrays[f"{prefix}/b{i}"])
        i += 1
    return h @ arrays[f"{prefix}/w{i}"] + arrays[f"{prefix}/b{i}"]


def policy_mean(arrays: dict, obs: np.ndarray) -> np.ndarray:
    """Mean action of the Gaussian policy, float32 [B, action_dim] (in [-1, 1] with the tanh mean head).

    The hidden-layer activation and the mean head (BatchPPO's reference
    network: ReLU, tanh) come with the weights (`ACTIVATION`, `MEAN_HEAD`).
    Args:
        arrays: named weights from the learner (see `layer_names`, OBS_MEAN, OBS_STD, OBS_CLIP).
        obs: raw observations [B, obs_dim].
    """
    out = mlp_forward(arrays, normalize_obs(arrays, obs), "policy", ACTIVATIONS[_code(arrays, ACTIVATION)])
    return np.tanh(out) if MEAN_HEADS[_code(arrays, MEAN_HEAD)] == "tanh" else out


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
    x = tf.transpose(tf.cast(frames, conv_kernels[0].dtype) / 255.0, [0, 2, 3, 1])
    for w, b, stride in zip(conv_kernels, conv_biases, CONV_STRIDES):
        x = tf.nn.relu(tf.nn.conv2d(x, w, stride, "VALID") + b)
    x = tf.reshape(x, [tf.shape(x)[0], -1])
    for i, (w, b) in enumerate(zip(kernels, biases)):
        x = tf.matmul(x, w) + b
        if i < len(kernels) - 1:
            x = tf.nn.relu(x)
    return tf.cast(x, tf.float32)


_nature_cnn_q = tf.function(nature_cnn_q)
_cnn_weights: list = [None, None]  # (arrays dict it was made from, its tensors): converted once per version


def q_values(arrays: dict, obs: np.ndarray) -> np.ndarray:
    """Q(s, ·) of the pushed Q-network: float32 [B, num_actions].

    Args:
        arrays: an MLP (`q/w{i}`, `q/b{i}`) or, with `q/conv{i}/*`, the Nature CNN.
        obs: [B, obs_dim] vectors, or uint8 [B, S, 84, 84] frames for the CNN.
    """
    if conv_names(0)[0] not in arrays:
        return mlp_forward(arrays, np.asarray(obs, np.float32), "q")
    if _cnn_weights[0] is not arrays:
        n_conv = len(CONV_STRIDES)
        n_dense = sum(1 for k in arrays if k.startswith("q/w"))
        _cnn_weights[:] = (
            arrays,
            [[tf.constant(arrays[conv_names(i)[j]]) for i in range(n_conv)] for j in (0, 1)]
            + [[tf.constant(arrays[f"q/{p}{i}"]) for i in range(n_dense)] for p in ("w", "b")],
        )
    return _nature_cnn_q(tf.constant(obs), *_cnn_weights[1]).numpy()


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
