"""BatchPPO update on batches read from replay (no server code here).

Hafner et al. 2017 (BatchPPO): separate policy and value networks, observations
normalised by streaming mean/std and clipped to ±5, rewards scaled by their
streaming root mean square (the std for zero-mean rewards; not centred,
see `RunningMeanStd.scale`) and clipped to ±10, normalised advantages, a
KL-penalty objective with adaptive β and a quadratic cutoff, several epochs per
batch. Data produced by an older behaviour policy is corrected by the
importance ratio π_new(a|s) / π_behaviour(a|s); the penalty is
KL(behaviour ‖ new).
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from actors.envs import EnvSpec
from actors.policy import OBS_MEAN, OBS_STD
from learner import ppo_math
from learner.networks import GaussianPolicy, ValueNetwork
from learner.normalizer import RunningMeanStd
from learner.presets import PPOConfig

_SPEC_1D = tf.TensorSpec([None], tf.float32)
_SPEC_2D = tf.TensorSpec([None, None], tf.float32)


class BatchPPO:
    """BatchPPO learner state and update rule.

    Args:
        spec: environment spec (continuous actions).
        config: hyperparameters (see `learner.presets`).
        seed: initialisation seed.
    """

    def __init__(self, spec: EnvSpec, config: PPOConfig, seed: int = 0):
        obs_dim = spec.obs_shape[0]
        self.config = config
        self.policy = GaussianPolicy(obs_dim, spec.action_dim, list(config.policy_hidden),
                                     config.init_std, config.mean_init_factor, seed)
        self.value = ValueNetwork(obs_dim, list(config.value_hidden), seed + 1)
        self.policy_opt = tf.keras.optimizers.Adam(config.learning_rate)
        self.value_opt = tf.keras.optimizers.Adam(config.learning_rate)
        self.policy_opt.build(self.policy.trainable_variables)
        self.value_opt.build(self.value.trainable_variables)
        self.obs_norm = RunningMeanStd(obs_dim, clip=config.obs_clip, center=True)
        self.reward_norm = RunningMeanStd((), clip=config.reward_clip, center=False)
        self.beta = float(config.init_beta)
        self.rng = np.random.default_rng(seed)
        # Mirrors of the numpy state for tf.train.Checkpoint.
        self.ckpt_state = {
            "beta": tf.Variable(self.beta, dtype=tf.float64),
            "obs_count": tf.Variable(0.0, dtype=tf.float64),
            "obs_mean": tf.Variable(np.zeros(obs_dim), dtype=tf.float64),
            "obs_var": tf.Variable(np.ones(obs_dim), dtype=tf.float64),
            "rew_count": tf.Variable(0.0, dtype=tf.float64),
            "rew_mean": tf.Variable(0.0, dtype=tf.float64),
            "rew_var": tf.Variable(1.0, dtype=tf.float64),
        }

    def checkpoint_items(self) -> dict:
        """Trackables for `tf.train.Checkpoint` (call `sync_to_checkpoint` before saving)."""
        return dict(policy=self.policy, value=self.value, policy_opt=self.policy_opt,
                    value_opt=self.value_opt, **self.ckpt_state)

    def sync_to_checkpoint(self) -> None:
        s = self.ckpt_state
        s["beta"].assign(self.beta)
        for prefix, norm in (("obs", self.obs_norm), ("rew", self.reward_norm)):
            s[f"{prefix}_count"].assign(norm.count)
            s[f"{prefix}_mean"].assign(norm.mean)
            s[f"{prefix}_var"].assign(norm.var)

    def sync_from_checkpoint(self) -> None:
        s = self.ckpt_state
        self.beta = float(s["beta"].numpy())
        for prefix, norm in (("obs", self.obs_norm), ("rew", self.reward_norm)):
            norm.load_state_dict({"count": s[f"{prefix}_count"].numpy(),
                                  "mean": s[f"{prefix}_mean"].numpy(), "var": s[f"{prefix}_var"].numpy()})

    def export_weights(self) -> dict:
        """Everything the actors' numpy policy needs: policy layers, log-std, obs normalizer."""
        out = self.policy.export()
        out[OBS_MEAN] = self.obs_norm.mean.astype(np.float32)
        out[OBS_STD] = self.obs_norm.std.astype(np.float32)
        return out

    @tf.function(input_signature=[_SPEC_2D, _SPEC_2D, _SPEC_1D, _SPEC_2D, _SPEC_2D, _SPEC_1D,
                                  _SPEC_1D, tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([], tf.float32)])
    def _train(self, obs, actions, beh_log_prob, beh_mean, beh_log_std, advantages, returns, minibatches, beta):
        """All gradient steps of one update in one graph call.

        `minibatches` [S, M] int32 holds the sample indices of each of the S
        gradient steps (epochs × minibatches, reshuffled every epoch).
        """
        c = self.config
        policy_loss = v_loss = tf.constant(0.0)
        for i in tf.range(tf.shape(minibatches)[0]):
            idx = minibatches[i]
            o, a = tf.gather(obs, idx), tf.gather(actions, idx)
            with tf.GradientTape() as tape:
                mean, log_std = self.policy(o)
                log_prob = ppo_math.gaussian_log_prob(mean, log_std, a)
                kl = ppo_math.gaussian_kl(tf.gather(beh_mean, idx), tf.gather(beh_log_std, idx), mean, log_std)
                policy_loss, _ = ppo_math.ppo_kl_penalty_loss(
                    log_prob, tf.gather(beh_log_prob, idx), tf.gather(advantages, idx), kl, beta,
                    c.kl_target, c.kl_cutoff_factor, c.kl_cutoff_coef)
            grads = tape.gradient(policy_loss, self.policy.trainable_variables)
            self.policy_opt.apply_gradients(zip(grads, self.policy.trainable_variables))
            with tf.GradientTape() as tape:
                v_loss = ppo_math.value_loss(self.value(o), tf.gather(returns, idx))
            grads = tape.gradient(v_loss, self.value.trainable_variables)
            self.value_opt.apply_gradients(zip(grads, self.value.trainable_variables))
        return policy_loss, v_loss

    def update(self, batch: dict) -> dict:
        """One BatchPPO update on a batch of trajectories.

        Args:
            batch: replay fields (see `replay.server.ppo_signature`) with leading
                shape [T+1, N]; step T only provides the bootstrap observation.
        Returns:
            metrics: policy_loss, value_loss, kl (mean KL(behaviour‖new) after
            the update), beta (after adaptation), gradient_steps.
        """
        c = self.config
        obs = batch["observation"]
        t, n, obs_dim = obs.shape[0] - 1, obs.shape[1], obs.shape[2]
        self.obs_norm.update(obs[:-1].reshape(-1, obs_dim))
        self.reward_norm.update(batch["reward"][:-1].reshape(-1))
        obs_n = self.obs_norm.normalize(obs)
        rewards = self.reward_norm.normalize(batch["reward"][:-1])
        values = self.value(obs_n.reshape(-1, obs_dim)).numpy().reshape(t + 1, n)
        adv, returns = ppo_math.gae_advantages(rewards, values[:-1], values[-1],
                                               batch["done"][:-1].astype(np.float32),
                                               c.discount, c.gae_lambda)
        adv = ppo_math.normalize_advantages(adv)
        flat = lambda x: np.asarray(x[:t] if x.shape[0] == t + 1 else x).reshape(t * n, *x.shape[2:])
        data = [flat(obs_n), flat(batch["action"]), flat(batch["behaviour_log_prob"]),
                flat(batch["behaviour_mean"]), flat(batch["behaviour_log_std"]),
                flat(adv.numpy()), flat(returns.numpy())]
        data = [tf.constant(x, tf.float32) for x in data]
        size = t * n
        mb = max(1, size // max(1, c.num_minibatches))
        per_epoch = size // mb
        minibatches = np.concatenate([self.rng.permutation(size)[:per_epoch * mb].reshape(per_epoch, mb)
                                      for _ in range(c.epochs)]).astype(np.int32)
        p_loss, v_loss = self._train(*data, tf.constant(minibatches), tf.constant(self.beta, tf.float32))
        steps = len(minibatches)
        mean, log_std = self.policy(data[0])
        kl = float(tf.reduce_mean(ppo_math.gaussian_kl(data[3], data[4], mean, log_std)))
        self.beta = ppo_math.adapt_kl_beta(self.beta, kl, c.kl_target)
        return {"policy_loss": float(p_loss), "value_loss": float(v_loss), "kl": kl,
                "beta": self.beta, "gradient_steps": steps}
