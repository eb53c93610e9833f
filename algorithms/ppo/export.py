"""BatchPPO's policy as a standalone TensorFlow module for `rlfleet export`: raw observations in, env actions out,
with the observation normalization, its clip and the action scaling inside, computed as the actors compute them
(`rlfleet.algorithms.ppo.policy.mean_env_action`) from the same weights."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from rlfleet.actors.envs import EnvSpec
from rlfleet.actors.policy import ACTIVATIONS, scalar_code
from rlfleet.algorithms.ppo.policy import ACTIVATION, MEAN_HEAD, MEAN_HEADS, OBS_CLIP, OBS_MEAN, OBS_STD, layer_names


class PPOServing(tf.Module):
    """The mean action of BatchPPO's Gaussian policy on the env's Box bounds.

    `serve(observations)`: float32 [B, obs_dim] raw observations -> {"actions": float32 [B, action_dim]}, each
    action in [action_low, action_high]. The weights are variables of the module (saved with it).

    Args:
        arrays: the learner's exported weights (`PPOAgent.export_weights`).
        spec: the env's spaces (observation size, action bounds).
    """

    def __init__(self, arrays: dict, spec: EnvSpec):
        super().__init__(name="ppo_policy")
        f32 = lambda name: tf.Variable(np.asarray(arrays[name], np.float32), trainable=False)  # noqa: E731
        self.obs_mean, self.obs_std = f32(OBS_MEAN), f32(OBS_STD)
        self.obs_clip = tf.Variable(float(np.ravel(arrays[OBS_CLIP])[0]), trainable=False)
        self.kernels, self.biases = [], []
        i = 0
        while layer_names(i)[0] in arrays:
            w, b = layer_names(i)
            self.kernels.append(f32(w))
            self.biases.append(f32(b))
            i += 1
        self.activation = ACTIVATIONS[scalar_code(arrays, ACTIVATION)]
        self.tanh_mean = MEAN_HEADS[scalar_code(arrays, MEAN_HEAD)] == "tanh"
        self.action_low = tf.Variable(np.asarray(spec.action_low, np.float32), trainable=False)
        self.action_high = tf.Variable(np.asarray(spec.action_high, np.float32), trainable=False)
        signature = [tf.TensorSpec([None, spec.obs_shape[0]], tf.float32, name="observations")]
        self.serve = tf.function(self._serve, input_signature=signature)

    def _serve(self, observations):
        x = tf.clip_by_value((observations - self.obs_mean) / self.obs_std, -self.obs_clip, self.obs_clip)
        act = tf.tanh if self.activation == "tanh" else tf.nn.relu
        for i, (w, b) in enumerate(zip(self.kernels, self.biases)):
            x = tf.matmul(x, w) + b
            if i < len(self.kernels) - 1:
                x = act(x)
        mean = tf.tanh(x) if self.tanh_mean else x
        a = tf.clip_by_value(mean, -1.0, 1.0)
        return {"actions": self.action_low + (a + 1.0) * 0.5 * (self.action_high - self.action_low)}
