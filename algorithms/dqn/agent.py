"""DQN with n-step returns in the learner service (MLP Q-network for vectors, Nature CNN for Atari).

Dopamine / reincarnating_rl DQN: Huber TD loss on n-step targets (n = 3) with
a periodically copied target network, Adam (eps 1.5e-4), minibatches sampled
uniformly (or prioritized) from a Reverb table whose `SampleToInsertRatio`
rate limiter holds the replay ratio; ε-greedy actors whose ε decays linearly
with the run's env steps and is pushed with the weights.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from rlfleet.algorithms.base import Agent, StepResult
from rlfleet.algorithms.dqn import losses
from rlfleet.algorithms.dqn.config import DQNConfig
from rlfleet.algorithms.dqn.items import TABLE, batches, dqn_signature, envs_per_item, table_envs
from rlfleet.algorithms.dqn.networks import export_q, make_q_network, network_kind
from rlfleet.algorithms.dqn.policy import epsilon_greedy, epsilon_greedy_q, q_values
from rlfleet.algorithms.library.evaluation import run_batched_episodes
from rlfleet.envs.core import EnvSpec


def evaluate_dqn(
    arrays: dict, env_id: str, episodes: int, seed: int, epsilon: float = 0.001, progress: str | None = None
) -> list[float]:
    """DQN evaluation: ε-greedy on the Q-network with a small ε (default 0.001, the reincarnating_rl / Dopamine
    evaluation ε), one episode per env, all envs in one batch; the undiscounted return of each episode.
    `progress`: name the evaluation in progress lines while it runs (`run_batched_episodes`).

    Raises:
        EvaluationInterrupted: the learner is stopping (`rlfleet.algorithms.library.evaluation.STOP`).
    """
    return evaluate_q(lambda obs: q_values(arrays, obs), env_id, episodes, seed, epsilon, progress)


def evaluate_q(
    q, env_id: str, episodes: int, seed: int, epsilon: float = 0.001, progress: str | None = None
) -> list[float]:
    """`evaluate_dqn` for any Q-function `q`: numpy observations [B, ...] -> Q-values [B, actions] (a teacher's
    model file too); ε-greedy draws seeded by `seed`.

    Raises:
        EvaluationInterrupted: the learner is stopping (`rlfleet.algorithms.library.evaluation.STOP`).
    """
    rng = np.random.default_rng(seed)
    act = lambda obs: epsilon_greedy_q(q(obs), rng, epsilon)  # noqa: E731
    return run_batched_episodes(env_id, episodes, seed, act, progress=progress).returns


def passed_multiple(steps: int, k: int, period: int) -> bool:
    """Whether the last `k` learner steps, which ended at `steps`, passed a multiple of `period`."""
    return steps // period > (steps - k) // period


def dqn_policy(arrays: dict, epsilon: float, seed: int):
    """ε-greedy on the Q-network `arrays` (`export_q`), observations [B, ...] -> int32 actions [B], its random
    draws seeded by `seed`."""
    rng = np.random.default_rng(seed)
    return lambda obs: epsilon_greedy(arrays, obs, rng, epsilon)


class DQNAgent(Agent):
    """DQN learner state and update rule.

    Args:
        spec: env spec with discrete actions (vector observations or stacked Atari frames).
        config: `DQNConfig`.
        seed: initialisation seed.
    """

    algo, table = "dqn", TABLE

    def __init__(self, spec: EnvSpec, config: DQNConfig, seed: int = 0, total_steps: int = 0):
        self.spec, self.config, self.total_steps = spec, config, total_steps
        self.unroll_length = config.n_step  # the actor makes an item of n+S steps every step
        self.envs_per_item = envs_per_item(config.envs_per_actor, config.batch_size, config.envs_per_item)
        self.q = make_q_network(spec, config, seed, "q")
        self.target_q = make_q_network(spec, config, seed, "target_q")
        self.optimizer = tf.keras.optimizers.Adam(config.learning_rate, epsilon=config.adam_epsilon)
        self.optimizer.build(self.q.trainable_variables)
        self.learner_steps = tf.Variable(0, dtype=tf.int64)
        self.epsilon = config.epsilon_start
        self._priorities = None  # a Reverb client while prioritized replay is read (`samples`)
        self._max_priority = 0.0  # the largest priority set so far (`_update_priorities`)
        self._copy_target()

    def _copy_target(self) -> None:
        for t, s in zip(self.target_q.trainable_variables, self.q.trainable_variables):
            t.assign(s)

    def signature(self) -> dict:
        s = self.spec
        return dqn_signature(
            s.frame_shape, tf.as_dtype(s.obs_dtype), self.config.n_step, s.frame_stack, self.envs_per_item
        )

    def signature_error(self, signature: dict, source: str | None = None) -> str | None:
        """The run's own table must be `signature()`; another replay source's (a teacher's replay) may hold items
        of any number of envs, or the single-env layout (`rlfleet.algorithms.dqn.items.transitions`), of the
        same frames and n."""
        if source is None or table_envs(signature or {}) is None:
            return super().signature_error(signature, source)
        want, got = self.signature()["observation"], signature["observation"]
        frame, want_frame = list(got.shape[2 if "end" in signature else 1 :]), list(want.shape[2:])
        if got.dtype != want.dtype or frame != want_frame:
            return f"its frames are {got.dtype.name} {frame}, this run's are {want.dtype.name} {want_frame}"
        if got.shape[0] != want.shape[0]:
            return f"its items hold {got.shape[0]} steps, this run's n_step and frame stack need {want.shape[0]}"
        return None

    def actor_network(self) -> dict:
        s = self.spec
        return dict(
            observation_shape=list(s.obs_shape),
            frame_stack=s.frame_stack,
            num_actions=s.action_dim,
            network=network_kind(s, self.config.network),
        )

    def export_weights(self) -> dict:
        return export_q(self.q)

    def exploration(self) -> dict:
        return {"epsilon": float(self.epsilon)}

    def checkpoint_items(self) -> dict:
        return dict(q=self.q, target_q=self.target_q, optimizer=self.optimizer, dqn_learner_steps=self.learner_steps)

    def samples(self, replay_address: str):
        """Yields `gradient_steps_per_call` minibatches of transitions at a time ([K, batch, ...] fields of
        `rlfleet.algorithms.dqn.items.transitions`) from the replay table."""
        c = self.config
        self._open_priorities(replay_address)
        stack, k = self.spec.frame_stack, c.gradient_steps_per_call
        yield from batches(replay_address, c.batch_size, c.n_step, stack, k, with_info=c.prioritized)

    def _open_priorities(self, replay_address: str) -> None:
        """With prioritized replay, the Reverb client that `consume` updates the run's table's priorities with."""
        if self.config.prioritized and self._priorities is None:
            import reverb

            self._priorities = reverb.Client(replay_address)

    def _update_priorities(self, batch, priorities) -> None:
        """Sets the priorities of the items of `batch` (their "key" [K, items], from the run's prioritized
        table) from `priorities` [K, items]; a batch of another table (a teacher's) has no keys and is left.

        Actors insert new items at priority 1; so that 1 is the largest priority, as Schaul et al. 2016 insert
        new transitions at the largest so far (each is replayed soon), the table holds each priority divided by
        the largest this learner has set (its ratios to the others are kept; as that largest grows, older items
        keep their share of it)."""
        if self._priorities is None or "key" not in batch:
            return
        keys, values = batch["key"].numpy().ravel(), priorities.numpy().ravel()
        self._max_priority = max(self._max_priority, float(values.max(initial=0.0)))
        scaled = np.minimum(values / self._max_priority, 1.0) if self._max_priority > 0 else values
        self._priorities.mutate_priorities(TABLE, dict(zip(keys.tolist(), scaled.tolist())))

    def _td_loss(self, batch):
        """Huber TD loss on n-step targets over the batch's valid transitions, weighted by prioritized replay's
        importance weights where the batch has its sample info (`rlfleet.algorithms.dqn.items.sample_info`);
        returns (loss, Q(s_t, ·) [N, A], mean Q(s_t, a_t), the sampled items' new priorities [K] (empty
        without sample info))."""
        c = self.config
        rewards = batch["reward"]
        if c.reward_clip:
            rewards = tf.clip_by_value(rewards, -c.reward_clip, c.reward_clip)
        q_all = self.q(batch["observation"])
        bootstrap_obs = batch["next_observation"]
        bootstrap = losses.bootstrap_value(self.target_q(bootstrap_obs), self.q(bootstrap_obs) if c.double_q else None)
        targets, _ = losses.n_step_targets(rewards, batch["done"], bootstrap, c.discount)
        q_selected = tf.gather(q_all, batch["action"], batch_dims=1)
        valid = batch["valid"]
        loss, priorities = losses.huber_td_loss(q_selected, targets, weights=valid), tf.zeros([0], tf.float32)
        if "probability" in batch:  # Schaul et al. 2016: mean over the transitions of w_i · loss_i
            items = tf.shape(batch["key"])[0]
            importance = losses.importance_weights(batch["probability"], batch["table_size"], c.importance_exponent)
            weights = valid * tf.gather(importance, batch["item"])
            weighted = losses.huber_td_loss(q_selected, targets, weights=weights)
            loss = weighted * tf.reduce_sum(weights) / tf.maximum(tf.reduce_sum(valid), 1.0)
            priorities = losses.item_priorities(targets - q_selected, batch["item"], items, valid)
        return loss, q_all, losses.weighted_mean(q_selected, valid), priorities

    def _td_step(self, batch):
        """One gradient step of the TD loss on a minibatch ([N, ...] fields); returns (loss, mean Q, the items'
        new priorities)."""
        with tf.GradientTape() as tape:
            loss, _, mean_q, priorities = self._td_loss(batch)
        grads = tape.gradient(loss, self.q.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.q.trainable_variables))
        return loss, mean_q, priorities

    @tf.function
    def _train_step(self, batch):
        """`_td_step` as a graph of its own (one minibatch, learner steps not counted)."""
        return self._td_step(batch)

    @tf.function
    def _train_steps(self, minibatches):
        """`_td_step` on each of the K minibatches of `minibatches` in one graph (`_steps_in_graph`)."""
        return self._steps_in_graph(self._td_step, minibatches)

    def _steps_in_graph(self, step, minibatches):
        """Traced inside a `tf.function`: `step` (a gradient step, minibatch -> tensors) on each of the K
        minibatches of `minibatches` ([K, N, ...] fields), `learner_steps` counted and the target network copied
        every `target_update_period` learner steps in between, as K calls would; returns the last step's
        tensors but its last, and that last one (the items' new priorities) of every step, stacked [K, ...]."""
        k = tf.shape(minibatches["action"])[0]
        out = self._counted_step(step, {f: v[0] for f, v in minibatches.items()})
        priorities = tf.TensorArray(tf.float32, size=k, infer_shape=False).write(0, out[-1])
        for i in tf.range(1, k):
            out = self._counted_step(step, {f: v[i] for f, v in minibatches.items()})
            priorities = priorities.write(i, out[-1])
        return (*out[:-1], priorities.stack())

    def _counted_step(self, step, batch):
        out = step(batch)
        self.learner_steps.assign_add(1)
        if self.learner_steps % self.config.target_update_period == 0:
            self._copy_target()
        return out

    def on_resume(self, env_steps: int) -> None:
        """Puts ε where its schedule is at `env_steps` (the first weights after a resume carry it)."""
        c = self.config
        self.epsilon = losses.linear_epsilon(env_steps, c.epsilon_start, c.epsilon_end, c.epsilon_decay_env_steps)

    def consume(self, batch, policy_version: int, env_steps: int) -> StepResult:
        """K gradient steps on the K minibatches of `batch` (`samples`); a policy version is published when
        the learner steps pass a multiple of `publish_every`."""
        c = self.config
        if c.lr_schedule == "linear" and self.total_steps:
            progress = min(1.0, env_steps / self.total_steps)
            self.optimizer.learning_rate.assign(c.learning_rate * (1.0 - (1.0 - c.lr_final_fraction) * progress))
        k = int(batch["action"].shape[0])
        loss, mean_q, priorities = self._train_steps(batch)
        self._update_priorities(batch, priorities)
        steps = int(self.learner_steps.numpy())
        if not passed_multiple(steps, k, c.publish_every):
            return StepResult(gradient_steps=k)
        self.epsilon = losses.linear_epsilon(env_steps, c.epsilon_start, c.epsilon_end, c.epsilon_decay_env_steps)
        return StepResult(
            gradient_steps=k,
            updated=True,
            metrics={"td_loss": float(loss), "mean_q": float(mean_q), "epsilon": self.epsilon},
        )

    evaluation_batched = True

    def policy(self, stochastic: bool, seed: int):
        epsilon = self.epsilon if stochastic else self.config.epsilon_eval
        return dqn_policy(self.export_weights(), epsilon, seed)

    def serving_module(self):
        from rlfleet.algorithms.dqn.export import DQNServing

        return DQNServing(self.export_weights(), self.spec)

    def evaluate(self, episodes: int, seed: int) -> list[float]:
        return evaluate_dqn(self.export_weights(), self.spec.env_id, episodes, seed, self.config.epsilon_eval)
