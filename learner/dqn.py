"""DQN with n-step returns in the learner service (vector observations, MLP Q-network).

Dopamine / reincarnating_rl DQN: Huber TD loss on n-step targets (n = 3) with
a periodically copied target network, Adam (eps 1.5e-4), minibatches sampled
uniformly (or prioritized) from a Reverb table whose `SampleToInsertRatio`
rate limiter holds the replay ratio; ε-greedy actors whose ε decays linearly
with the run's env steps and is pushed with the weights.
"""
from __future__ import annotations

import numpy as np
import reverb
import tensorflow as tf

from actors.envs import EnvSpec
from actors.policy import EPSILON
from learner import dqn_math
from learner.agents import Agent, StepResult
from learner.evaluation import evaluate_dqn
from learner.networks import MLP
from learner.presets import DQNConfig
from replay.server import DQN_TABLE, dqn_signature


class DQNAgent(Agent):
    """DQN learner state and update rule.

    Args:
        spec: env spec with discrete actions and a flat observation vector.
        config: `DQNConfig`.
        seed: initialisation seed.
    """
    algo, table = "dqn", DQN_TABLE

    def __init__(self, spec: EnvSpec, config: DQNConfig, seed: int = 0):
        self.spec, self.config = spec, config
        self.unroll_length = config.n_step  # the actor makes an item of n+1 steps every step
        obs_dim = spec.obs_shape[0]
        sizes = [obs_dim, *config.hidden, spec.action_dim]
        self.q = MLP(sizes, 1.0, seed, "q")
        self.target_q = MLP(sizes, 1.0, seed, "target_q")
        self.optimizer = tf.keras.optimizers.Adam(config.learning_rate, epsilon=config.adam_epsilon)
        self.optimizer.build(self.q.trainable_variables)
        self.learner_steps = tf.Variable(0, dtype=tf.int64)
        self.epsilon = config.epsilon_start
        self._copy_target()

    def _copy_target(self) -> None:
        for t, s in zip(self.target_q.trainable_variables, self.q.trainable_variables):
            t.assign(s)

    def signature(self) -> dict:
        return dqn_signature(self.spec.obs_shape, tf.float32, self.config.n_step)

    def actor_network(self) -> dict:
        return dict(obs_dim=self.spec.obs_shape[0], num_actions=self.spec.action_dim, hidden=list(self.config.hidden))

    def export_weights(self) -> dict:
        out = {EPSILON: np.asarray(self.epsilon, np.float32)}
        for i, (w, b) in enumerate(zip(self.q.kernels, self.q.biases)):
            out[f"q/w{i}"], out[f"q/b{i}"] = w.numpy(), b.numpy()
        return out

    def checkpoint_items(self) -> dict:
        return dict(q=self.q, target_q=self.target_q, optimizer=self.optimizer, dqn_learner_steps=self.learner_steps)

    def samples(self, replay_address: str):
        """Yields minibatches {field: [batch, n+1, ...]} drawn through Reverb's tf.data dataset."""
        c = self.config
        dataset = reverb.TrajectoryDataset.from_table_signature(
            server_address=replay_address, table=DQN_TABLE, max_in_flight_samples_per_worker=2 * c.batch_size)
        for sample in dataset.batch(c.batch_size, drop_remainder=True):
            yield sample.data

    @tf.function
    def _train_step(self, batch):
        c = self.config
        n = c.n_step
        obs = batch["observation"]
        with tf.GradientTape() as tape:
            q_all = self.q(obs[:, 0])
            bootstrap = tf.reduce_max(self.target_q(obs[:, n]), axis=-1)
            targets, _ = dqn_math.n_step_targets(batch["reward"][:, :n], tf.cast(batch["done"][:, :n], tf.float32),
                                                 bootstrap, c.discount)
            q_selected = tf.gather(q_all, tf.cast(batch["action"][:, 0], tf.int32), batch_dims=1)
            loss = dqn_math.huber_td_loss(q_selected, targets)
        grads = tape.gradient(loss, self.q.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.q.trainable_variables))
        return loss, tf.reduce_mean(q_selected)

    def consume(self, batch, version: int, env_steps: int) -> StepResult:
        c = self.config
        loss, mean_q = self._train_step(batch)
        steps = int(self.learner_steps.assign_add(1).numpy())
        if steps % c.target_update_period == 0:
            self._copy_target()
        if steps % c.publish_every:
            return StepResult(gradient_steps=1)
        self.epsilon = dqn_math.linear_epsilon(env_steps, c.epsilon_start, c.epsilon_end, c.epsilon_decay_env_steps)
        return StepResult(gradient_steps=1, updated=True,
                          metrics={"td_loss": float(loss), "mean_q": float(mean_q), "epsilon": self.epsilon})

    def evaluate(self, episodes: int, seed: int) -> list[float]:
        return evaluate_dqn(self.export_weights(), self.spec.env_id, episodes, seed, self.config.epsilon_eval)
