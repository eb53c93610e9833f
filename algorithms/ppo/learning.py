"""PPO update on batches read from replay (no server code here).

The update rule of BatchPPO (Hafner et al. 2017) and, by settings, of the
clipped PPO objective (Schulman et al. 2017): separate policy and value
networks, observations normalised by streaming mean/std and clipped to
±obs_clip, rewards scaled as `reward_scale` says (BatchPPO: by their streaming
RMS, clipped to ±10), normalised advantages, several epochs of minibatches per
batch. A time limit is not a terminal state: a truncated step bootstraps from
V(final observation). Data from older behaviour policies (actors run up to
`max_policy_lag` versions behind) is handled with a decoupled objective
(Hilton et al. 2021): the ratio and the KL term are taken to the policy at
the start of the update, and each sample is weighted by π_that/π_behaviour;
or, with `off_policy_objective` "behaviour", the clipped ratio is taken to the
behaviour policy itself (as IMPALA-style asynchronous PPO does), so that no
update moves the policy more than the clip range from the data's policy; or,
with "uncorrected", to the learner's policy with no weights (an ablation: what
the correction is worth). With `advantage_traces` "ratio" the advantages of
lagged data weight later steps' TD errors by the truncated ratios of the
learner's policy to the behaviour policy (`losses.traced_gae_advantages`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import tensorflow as tf

from rlfleet.algorithms.library.normalizer import RunningMeanStd
from rlfleet.algorithms.ppo import losses
from rlfleet.algorithms.ppo.config import PPOConfig
from rlfleet.algorithms.ppo.networks import GaussianPolicy, ValueNetwork
from rlfleet.algorithms.ppo.policy import OBS_CLIP, OBS_MEAN, OBS_STD
from rlfleet.envs.core import EnvSpec

_SPEC_1D = tf.TensorSpec([None], tf.float32)
_SPEC_2D = tf.TensorSpec([None, None], tf.float32)
_SPEC_3D = tf.TensorSpec([None, None, None], tf.float32)
_SPEC_2D_BOOL = tf.TensorSpec([None, None], tf.bool)


class Rollout(NamedTuple):
    """A batch of trajectories as the update's graph takes it (`BatchPPO._graph_inputs`), T steps of N envs."""

    obs: object  # float32 [T+1, N, obs_dim]: normalised observations; step T only bootstraps
    final_obs: object  # float32 [T, N, obs_dim]: normalised true last observations (used where truncated)
    rewards: object  # float32 [T, N]: scaled rewards
    terminated: object  # bool [T, N]
    truncated: object  # bool [T, N]: a time limit cut the episode (never also terminated)
    actions: object  # float32 [T, N, A]
    behaviour_log_prob: object  # float32 [T, N]: log π_behaviour(a|s), as the actors sampled


class UpdateSamples(NamedTuple):
    """One update's samples, flattened over time and envs (N samples), that its gradient steps draw minibatches
    from (`BatchPPO._train`)."""

    obs: object  # float32 [N, obs_dim]
    actions: object  # float32 [N, A]
    anchor_log_prob: object  # float32 [N]: the ratio's anchor (`off_policy_objective`)
    prox_mean: object  # float32 [N, A]: the proximal policy's (the policy when the update starts)
    prox_log_std: object  # float32 [N, A]
    start_log_prob: object  # float32 [N]: log-probs under the policy when the update starts (`target_kl`)
    is_weights: object  # float32 [N]: importance weights (π_prox / π_behaviour, truncated, or 1)
    advantages: object  # float32 [N]
    returns: object  # float32 [N]: value targets
    old_values: object  # float32 [N]: V(s) when the update started (the clipped value loss)


_ROLLOUT_SPEC = Rollout(_SPEC_3D, _SPEC_3D, _SPEC_2D, _SPEC_2D_BOOL, _SPEC_2D_BOOL, _SPEC_3D, _SPEC_2D)
_SAMPLES_SPEC = UpdateSamples(
    _SPEC_2D, _SPEC_2D, _SPEC_1D, _SPEC_2D, _SPEC_2D, _SPEC_1D, _SPEC_1D, _SPEC_1D, _SPEC_1D, _SPEC_1D
)


class BatchPPO:
    """BatchPPO learner state and update rule.

    Args:
        spec: environment spec (continuous actions).
        config: hyperparameters (see `rlfleet.algorithms.ppo.config`).
        seed: initialisation seed.
    """

    def __init__(self, spec: EnvSpec, config: PPOConfig, seed: int = 0):
        obs_dim = spec.obs_shape[0]
        self.config = config
        self.policy = GaussianPolicy(obs_dim, spec.action_dim, config, seed)
        self.value = ValueNetwork(obs_dim, list(config.value_hidden), seed + 1, config.activation, config.init)
        # With `shared_optimizer` policy_opt steps both networks (one Adam, one gradient clip, as CleanRL) and
        # value_opt is unused; the checkpoint holds both either way.
        self.policy_opt = tf.keras.optimizers.Adam(config.learning_rate, epsilon=config.adam_epsilon)
        self.value_opt = tf.keras.optimizers.Adam(config.learning_rate, epsilon=config.adam_epsilon)
        shared = self.value.trainable_variables if config.shared_optimizer else ()
        self.policy_opt.build(self.policy.trainable_variables + shared)
        self.value_opt.build(self.value.trainable_variables)
        # Without normalization the raw observations are not clipped either (they are not in std units).
        self.obs_norm = RunningMeanStd(obs_dim, clip=config.obs_clip if config.obs_normalization else None, center=True)
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
        return dict(
            policy=self.policy,
            value=self.value,
            policy_opt=self.policy_opt,
            value_opt=self.value_opt,
            **self.ckpt_state,
        )

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
            norm.load_state_dict(
                {
                    "count": s[f"{prefix}_count"].numpy(),
                    "mean": s[f"{prefix}_mean"].numpy(),
                    "var": s[f"{prefix}_var"].numpy(),
                }
            )

    def export_weights(self) -> dict:
        """Everything the actors' numpy policy needs: policy layers, log-std, obs normalizer (mean, std, clip).

        Every setting that changes what the policy outputs travels here, so the
        actors' behaviour policy and the evaluator compute the learner's policy
        exactly (`tests/test_one_policy.py`).
        """
        out = self.policy.export()
        out[OBS_MEAN] = self.obs_norm.mean.astype(np.float32)
        out[OBS_STD] = self.obs_norm.std.astype(np.float32)
        # No clip travels as float32's largest value (clipping to it changes nothing): every exported weight is
        # finite, which the learner checks before publishing (actors of before took +inf, and still accept it).
        no_clip = np.finfo(np.float32).max
        out[OBS_CLIP] = np.float32(no_clip if self.obs_norm.clip is None else self.obs_norm.clip)
        return out

    def _apply(self, optimizer, grads, variables) -> None:
        """One optimizer step; gradients clipped to a global norm of `max_grad_norm` when it is > 0."""
        if self.config.max_grad_norm > 0:
            grads, _ = tf.clip_by_global_norm(grads, self.config.max_grad_norm)
        optimizer.apply_gradients(zip(grads, variables))

    @tf.function(input_signature=[_SAMPLES_SPEC, tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([], tf.float32)])
    def _train(self, samples: UpdateSamples, minibatches, beta):
        """All gradient steps of one update in one graph call.

        The ratio and the KL term are taken to `samples.anchor_log_prob`, the anchor `off_policy_objective`
        chooses (the proximal policy, i.e. the policy when the update starts, or the behaviour policy), and
        `samples.is_weights` weigh the samples (π_prox / π_behaviour, `losses.proximal_weights`, or 1).
        `minibatches` [S, M] int32 holds the sample indices of each of the S
        gradient steps (epochs × minibatches, reshuffled every epoch); `beta` is the KL penalty's coefficient.
        With `target_kl` > 0 the steps stop at the first minibatch whose approx KL from the policy at the
        update's start (`samples.start_log_prob`, whatever the ratio's anchor) exceeds 1.5 × target_kl, before
        its step (Stable-Baselines3's `target_kl`; CleanRL checks once per epoch); the first step is always taken.
        Returns (last policy loss, last value loss, approx KL and clip fraction averaged over the gradient
        steps taken, each measured on its minibatch before its step, and the number of steps taken, int32).
        Stable-Baselines3 and CleanRL average their clip fractions the same way, but Stable-Baselines3's approx KL
        is the last epoch's mean and CleanRL's the last minibatch's, usually the larger for the same update.
        After a stop the losses are those of the minibatch that stopped it (not stepped on), as Stable-Baselines3
        logs them; under `off_policy_objective` behaviour the approx KL returned is to the behaviour policy, while
        the stop compares the KL to the update's start.
        """
        c = self.config
        policy_loss = v_loss = tf.constant(0.0)
        kl_sum = clip_sum = tf.constant(0.0)
        steps = tf.shape(minibatches)[0]
        taken = tf.constant(0)
        policy_vars, value_vars = self.policy.trainable_variables, self.value.trainable_variables
        for i in tf.range(steps):
            idx = minibatches[i]
            old_log_prob = tf.gather(samples.anchor_log_prob, idx)
            with tf.GradientTape(persistent=True) as tape:
                log_prob, policy_loss, v_loss = self._minibatch_losses(idx, samples, old_log_prob, beta)
                total = policy_loss + c.value_loss_coef * v_loss
            if c.target_kl > 0:
                if tf.logical_and(
                    i > 0, losses.approx_kl(log_prob, tf.gather(samples.start_log_prob, idx)) > 1.5 * c.target_kl
                ):
                    break
            if c.shared_optimizer:
                both = tuple(policy_vars) + tuple(value_vars)
                self._apply(self.policy_opt, tape.gradient(total, both), both)
            else:
                self._apply(self.policy_opt, tape.gradient(policy_loss, policy_vars), policy_vars)
                self._apply(self.value_opt, tape.gradient(v_loss, value_vars), value_vars)
            del tape
            ratio = tf.exp(log_prob - old_log_prob)
            kl_sum += losses.approx_kl(log_prob, old_log_prob)
            clip_sum += tf.reduce_mean(tf.cast(tf.abs(ratio - 1.0) > c.clip_epsilon, tf.float32))
            taken += 1
        n = tf.cast(tf.maximum(taken, 1), tf.float32)
        return policy_loss, v_loss, kl_sum / n, clip_sum / n, taken

    def _minibatch_losses(self, idx, samples: UpdateSamples, old_log_prob, beta):
        """The policy and value losses of one minibatch (sample indices `idx` [M] into `samples`, as `_train` gets
        them; `old_log_prob` [M] the anchor's log-probs of those samples); returns (log π(a|s) [M], policy loss,
        value loss), inside the caller's gradient tape."""
        c = self.config
        o, a, w = tf.gather(samples.obs, idx), tf.gather(samples.actions, idx), tf.gather(samples.is_weights, idx)
        adv = tf.gather(samples.advantages, idx)
        if c.advantage_norm == "minibatch":
            adv = losses.normalize_advantages(adv)
        mean, log_std = self.policy(o)
        log_prob = losses.gaussian_log_prob(mean, log_std, a)
        if c.policy_objective == "clip":
            policy_loss, _ = losses.ppo_clip_loss(log_prob, old_log_prob, adv, c.clip_epsilon, w)
        else:
            kl = losses.gaussian_kl(
                tf.gather(samples.prox_mean, idx), tf.gather(samples.prox_log_std, idx), mean, log_std
            )
            policy_loss, _ = losses.ppo_kl_penalty_loss(
                log_prob, old_log_prob, adv, kl, beta, c.kl_target, (c.kl_cutoff_factor, c.kl_cutoff_coef), w
            )
        values = self.value(o)
        if c.value_clip > 0:
            v_loss = losses.clipped_value_loss(
                values, tf.gather(samples.old_values, idx), tf.gather(samples.returns, idx), c.value_clip
            )
        else:
            v_loss = losses.value_loss(values, tf.gather(samples.returns, idx))
        return log_prob, policy_loss, v_loss

    def scale_rewards(self, rewards: np.ndarray) -> np.ndarray:
        """Rewards as the value function and advantages see them, float32 (scaled ones clipped to ±reward_clip).

        `reward_scale` "rms": divided by the running root mean square of the
        rewards (BatchPPO: scaled, not centred); "return": divided by the
        running std of the episodes' discounted returns (the actors write them,
        `rlfleet.algorithms.ppo.items.ppo_signature`; as Stable-Baselines3's VecNormalize and
        CleanRL scale rewards); "none": unscaled. `reward_norm` holds the
        statistics of whichever of the two is tracked.
        """
        c = self.config
        if c.reward_scale == "rms":
            return self.reward_norm.normalize(rewards)
        if c.reward_scale == "none":
            return np.asarray(rewards, np.float32)
        if self.reward_norm.count > 0:
            rewards = rewards / self.reward_norm.std
        return np.clip(rewards, -c.reward_clip, c.reward_clip).astype(np.float32)

    def advantages(self, batch: dict, obs_n: np.ndarray | None = None):
        """Advantages and value targets of a batch under the current normalizers and value network.

        Rewards are scaled by the reward normalizer; a step whose episode a
        time limit cut (`truncated`) bootstraps from V(final_observation), a
        terminal one (`terminated`) from nothing (`losses.next_state_values`,
        `losses.gae_advantages`). Plain GAE whatever `advantage_traces` says: the traces need the
        learner's log-probabilities of the batch's actions, which `update` computes.

        Args:
            batch: replay fields (`rlfleet.algorithms.ppo.items.ppo_signature`), leading shape [T+1, N].
            obs_n: the batch's observations already normalised (float32 [T+1, N, obs_dim]), if the caller has them.
        Returns:
            (advantages, returns): float32 tensors [T, N], advantages not yet normalised.
        """
        inputs = self._graph_inputs(batch, obs_n)[:5]
        return self._advantages(*inputs, tf.zeros_like(inputs[2]))[:2]

    def _graph_inputs(self, batch: dict, obs_n: np.ndarray | None = None) -> Rollout:
        """The batch as `_advantages` and `_update` take it (`Rollout`, numpy arrays)."""
        obs = batch["observation"]
        obs_n = self.obs_norm.normalize(obs) if obs_n is None else obs_n
        return Rollout(
            np.asarray(obs_n, np.float32),
            self.obs_norm.normalize(batch["final_observation"][:-1]),
            self.scale_rewards(batch["reward"][:-1]),
            np.asarray(batch["terminated"][:-1], bool),
            np.asarray(batch["truncated"][:-1], bool),
            np.asarray(batch["action"][:-1], np.float32),
            np.asarray(batch["behaviour_log_prob"][:-1], np.float32),
        )

    @tf.function(input_signature=[_SPEC_3D, _SPEC_3D, _SPEC_2D, _SPEC_2D_BOOL, _SPEC_2D_BOOL, _SPEC_2D])
    def _advantages(self, obs_n, final_obs_n, rewards, terminated, truncated, log_ratios):
        """`advantages` in one graph: V of every observation and of every final observation (used where
        truncated), GAE over the time axis (`advantage_traces` "ratio": weighted by the ratios exp(`log_ratios`)
        [T, N] of the learner's policy to the behaviour policy truncated at 1, `losses.traced_gae_advantages`).
        Shapes as `_graph_inputs` returns them. Returns (advantages, value targets, V(obs_t)), each float32
        [T, N]."""
        c = self.config
        t1, n, obs_dim = tf.shape(obs_n)[0], tf.shape(obs_n)[1], tf.shape(obs_n)[2]
        values = tf.reshape(self.value(tf.reshape(obs_n, [-1, obs_dim])), [t1, n])
        final_values = tf.reshape(self.value(tf.reshape(final_obs_n, [-1, obs_dim])), [t1 - 1, n])
        next_values = losses.next_state_values(values[:-1], values[-1], truncated, final_values)
        if c.advantage_traces == "ratio":
            adv, returns = losses.traced_gae_advantages(
                rewards,
                values[:-1],
                next_values,
                terminated,
                terminated | truncated,
                c.discount,
                c.gae_lambda,
                losses.truncated_ratios(log_ratios),
            )
        else:
            adv, returns = losses.gae_advantages(
                rewards, values[:-1], next_values, terminated, terminated | truncated, c.discount, c.gae_lambda
            )
        return adv, returns, values[:-1]

    def update(self, batch: dict, progress: float = 0.0) -> dict:
        """One BatchPPO update on a batch of trajectories.

        Args:
            batch: replay fields (see `rlfleet.algorithms.ppo.items.ppo_signature`) with leading
                shape [T+1, N]; step T only provides the bootstrap observation.
            progress: fraction of the run's env-step budget trained on before this batch, in [0, 1]; with
                `lr_schedule` "linear" the step size is
                learning_rate × (1 − (1 − lr_final_fraction) × progress) (with a fraction of 0,
                annealed to 0 at the budget, as CleanRL's PPO does).
        Returns:
            metrics (floats; the names CleanRL and Stable-Baselines3 log where they have one):
            policy_loss, value_loss (the last gradient step's), kl (mean KL(proximal‖new): from
            the policy before this update to the one after it), approx_kl and clip_fraction (each gradient
            step's minibatch before its step, averaged over the update: |ratio − 1| > clip_epsilon),
            entropy (of the policy after the update, nats, summed over action dimensions), explained_variance
            (of the value targets by V before the update), beta (the KL penalty's, after adaptation; init_beta
            unchanged under the clip objective), policy_std (mean over action
            dimensions of the state-independent std), mean_importance_weight
            (π_proximal/π_behaviour, truncated; 1 with off_policy_objective behaviour or uncorrected, whose
            approx_kl and clip_fraction under behaviour measure the distance to the behaviour policy, lag
            included), max_importance_weight (π_proximal/π_behaviour before truncation),
            learning_rate (this update's), gradient_steps (taken: fewer than epochs × num_minibatches when
            `target_kl` stopped the update).
        """
        c = self.config
        done = min(max(progress, 0.0), 1.0) if c.lr_schedule == "linear" else 0.0
        lr = c.learning_rate * (1.0 - (1.0 - c.lr_final_fraction) * done)
        obs = batch["observation"]
        t, n, obs_dim = obs.shape[0] - 1, obs.shape[1], obs.shape[2]
        if c.reward_scale == "rms":
            self.reward_norm.update(batch["reward"][:-1].reshape(-1))
        elif c.reward_scale == "return":
            self.reward_norm.update(batch["discounted_return"][:-1].reshape(-1))
        # The batch is normalised with the observation statistics of the latest published weights, those the
        # actors acted with (on-policy data then gives importance weights of exactly 1); the batch updates the
        # statistics after, for the weights published next.
        inputs = self._graph_inputs(batch)
        if c.obs_normalization:
            self.obs_norm.update(obs[:-1].reshape(-1, obs_dim))
        size = t * n
        mb = max(1, size // max(1, c.num_minibatches))
        per_epoch = size // mb
        minibatches = np.concatenate(
            [self.rng.permutation(size)[: per_epoch * mb].reshape(per_epoch, mb) for _ in range(c.epochs)]
        ).astype(np.int32)
        out = self._update(inputs, minibatches, np.float32(self.beta), np.float32(lr))
        metrics = {k: float(v) for k, v in out.items()}
        if c.policy_objective == "kl_penalty":  # β exists only in that objective; clip leaves it at init_beta
            self.beta = losses.adapt_kl_beta(self.beta, metrics["kl"], c.kl_target)
        return dict(metrics, beta=self.beta, learning_rate=lr, gradient_steps=int(metrics["gradient_steps"]))

    @tf.function(
        input_signature=[
            _ROLLOUT_SPEC,
            tf.TensorSpec([None, None], tf.int32),
            tf.TensorSpec([], tf.float32),
            tf.TensorSpec([], tf.float32),
        ]
    )
    def _update(self, rollout: Rollout, minibatches, beta, lr):
        """`update` after the normalizers, in one graph call: advantages (normalised as `advantage_norm`
        says), the proximal policy's outputs and importance weights, every gradient step (`_train`), and the
        metrics `update` returns ({name: float32 scalar}). `minibatches` [S, M] int32: the sample indices of each
        gradient step; `beta`: the KL penalty's coefficient; `lr`: this update's learning rate.

        One call, not a few hundred eager ops: with Python 3.11, TensorFlow 2.15 keeps ~100 bytes per eager op
        or function call it runs (tensorflow/tensorflow#62551), so a learner making them per update grows steadily.
        """
        flat = lambda x: tf.reshape(x, tf.concat([[-1], tf.shape(x)[2:]], axis=0))
        obs_n, behaviour_log_prob = rollout.obs, rollout.behaviour_log_prob
        obs_t, actions = flat(obs_n[:-1]), flat(rollout.actions)
        prox_mean, prox_log_std = self.policy(obs_t)
        prox_log_prob = losses.gaussian_log_prob(prox_mean, prox_log_std, actions)
        log_ratios = tf.reshape(prox_log_prob, tf.shape(behaviour_log_prob)) - behaviour_log_prob
        adv, returns, values = self._advantages(*rollout[:5], log_ratios)
        if self.config.advantage_norm == "batch":
            adv = losses.normalize_advantages(adv)
        for opt in (self.policy_opt, self.value_opt):
            opt.learning_rate.assign(lr)
        if self.config.off_policy_objective == "behaviour":  # the ratio's anchor is the behaviour policy
            anchor_log_prob = flat(behaviour_log_prob)
            is_weights = tf.ones_like(anchor_log_prob)
        elif self.config.off_policy_objective == "uncorrected":  # the learner's policy, every sample weighs 1
            anchor_log_prob = prox_log_prob
            is_weights = tf.ones_like(anchor_log_prob)
        else:
            anchor_log_prob = prox_log_prob
            is_weights = losses.proximal_weights(
                prox_log_prob, flat(behaviour_log_prob), self.config.max_importance_weight
            )
        samples = UpdateSamples(
            obs=obs_t,
            actions=actions,
            anchor_log_prob=anchor_log_prob,
            prox_mean=prox_mean,
            prox_log_std=prox_log_std,
            start_log_prob=prox_log_prob,
            is_weights=is_weights,
            advantages=flat(adv),
            returns=flat(returns),
            old_values=flat(values),
        )
        p_loss, v_loss, approx_kl, clip_fraction, taken = self._train(samples, minibatches, beta)
        mean, log_std = self.policy(obs_t)
        return dict(
            policy_loss=p_loss,
            value_loss=v_loss,
            kl=tf.reduce_mean(losses.gaussian_kl(prox_mean, prox_log_std, mean, log_std)),
            approx_kl=approx_kl,
            clip_fraction=clip_fraction,
            gradient_steps=tf.cast(taken, tf.float32),
            entropy=tf.reduce_mean(losses.gaussian_entropy(log_std)),
            explained_variance=losses.explained_variance(values, returns),
            policy_std=tf.reduce_mean(tf.exp(self.policy.log_std)),
            mean_importance_weight=tf.reduce_mean(is_weights),
            # Before truncation; capped at float32's largest value so that the metric stays a finite number.
            max_importance_weight=tf.exp(tf.minimum(tf.reduce_max(prox_log_prob - flat(behaviour_log_prob)), 88.0)),
        )
