"""DQN's greedy policy as a standalone TensorFlow module for `rlfleet export`: observations in, the greedy action
and the Q-values out, computed as the actors compute them (`rlfleet.algorithms.dqn.policy.q_values`) from the
same weights (QDagger students export the same way)."""

from __future__ import annotations

import tensorflow as tf

from rlfleet.algorithms.dqn.policy import cnn_q, conv_count, conv_names
from rlfleet.algorithms.library.networks import dense_stack, frozen
from rlfleet.envs.core import EnvSpec


class DQNServing(tf.Module):
    """The greedy policy of a Q-network.

    `serve(observations)` -> {"actions": int32 [B] (argmax of the Q-values), "q_values": float32 [B, actions]};
    observations are float32 [B, obs_dim] vectors, or for Atari uint8 [B, 4, 84, 84] stacks of preprocessed
    frames (oldest first). The weights are variables of the module (saved with it).

    Args:
        arrays: the learner's exported weights (`DQNAgent.export_weights`).
        spec: the env's spaces.
    """

    def __init__(self, arrays: dict, spec: EnvSpec):
        super().__init__(name="dqn_policy")
        n_dense = sum(1 for k in arrays if k.startswith("q/w"))
        self.kernels = [frozen(arrays[f"q/w{i}"]) for i in range(n_dense)]
        self.biases = [frozen(arrays[f"q/b{i}"]) for i in range(n_dense)]
        n_conv = conv_count(arrays)
        self.cnn = n_conv > 0
        if self.cnn:
            self.conv_kernels = [frozen(arrays[conv_names(i)[0]]) for i in range(n_conv)]
            self.conv_biases = [frozen(arrays[conv_names(i)[1]]) for i in range(n_conv)]
            signature = [tf.TensorSpec([None, *spec.obs_shape], tf.uint8, name="observations")]
        else:
            signature = [tf.TensorSpec([None, spec.obs_shape[0]], tf.float32, name="observations")]
        self.serve = tf.function(self._serve, input_signature=signature)

    def _serve(self, observations):
        if self.cnn:
            q = cnn_q(observations, self.conv_kernels, self.conv_biases, self.kernels, self.biases)
        else:
            q = dense_stack(observations, self.kernels, self.biases, "relu")
        return {"actions": tf.argmax(q, axis=-1, output_type=tf.int32), "q_values": q}
