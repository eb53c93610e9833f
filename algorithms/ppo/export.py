"""BatchPPO's policy as a standalone TensorFlow module for `rlfleet export`: raw observations in, env actions out,
with the observation normalization, its clip and the action scaling inside, computed as the actors compute them
(`rlfleet.algorithms.ppo.policy.mean_env_action`) from the same weights."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from rlfleet.algorithms.library.networks import dense_stack, frozen
from rlfleet.algorithms.library.policy import ACTIVATIONS, scalar_code
from rlfleet.algorithms.ppo.policy import ACTIVATION, MEAN_HEAD, MEAN_HEADS, OBS_CLIP, OBS_MEAN, OBS_STD, layer_names
from rlfleet.envs.core import EnvSpec


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
        self.obs_mean, self.obs_std = frozen(arrays[OBS_MEAN]), frozen(arrays[OBS_STD])
        self.obs_clip = frozen(np.ravel(arrays[OBS_CLIP])[0])
        layers = [layer_names(i) for i in range(sum(1 for k in arrays if k.startswith("policy/w")))]
        self.kernels = [frozen(arrays[w]) for w, _ in layers]
        self.biases = [frozen(arrays[b]) for _, b in layers]
        self.activation = ACTIVATIONS[scalar_code(arrays, ACTIVATION)]
        self.tanh_mean = MEAN_HEADS[scalar_code(arrays, MEAN_HEAD)] == "tanh"
        self.action_low, self.action_high = frozen(spec.action_low), frozen(spec.action_high)
        signature = [tf.TensorSpec([None, spec.obs_shape[0]], tf.float32, name="observations")]
        self.serve = tf.function(self._serve, input_signature=signature)

    def _serve(self, observations):
        x = tf.clip_by_value((observations - self.obs_mean) / self.obs_std, -self.obs_clip, self.obs_clip)
        x = dense_stack(x, self.kernels, self.biases, self.activation)
        mean = tf.tanh(x) if self.tanh_mean else x
        a = tf.clip_by_value(mean, -1.0, 1.0)
        return {"actions": self.action_low + (a + 1.0) * 0.5 * (self.action_high - self.action_low)}
