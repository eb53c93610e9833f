"""BatchPPO in the learner service: `PPOAgent` reads the replay queue's items, keeps the policy lag in bounds,
runs an update per batch (`rlfleet.algorithms.ppo.learning.BatchPPO`) and evaluates with the mean action."""

from __future__ import annotations

import numpy as np
import reverb
import tensorflow as tf

from rlfleet.algorithms.base import Agent, CreditLimit, StepResult
from rlfleet.algorithms.library.evaluation import evaluate_policy
from rlfleet.algorithms.ppo.config import PPOConfig
from rlfleet.algorithms.ppo.items import TABLE, ppo_queue_items, ppo_signature
from rlfleet.algorithms.ppo.learning import BatchPPO
from rlfleet.algorithms.ppo.policy import mean_env_action, sample_actions, to_env_action
from rlfleet.envs.core import EnvSpec


def ppo_policy(arrays: dict, stochastic: bool, seed: int, action_low, action_high):
    """BatchPPO's policy on the weights `arrays` (`PPOAgent.export_weights`), observations [B, obs_dim] -> env
    actions float32 [B, action_dim] on the env's Box bounds: the Gaussian's mean action (as the BatchPPO paper
    evaluates), or with `stochastic` a sample of it, clipped to the bounds as actors act (random draws seeded
    by `seed`)."""
    low, high = np.asarray(action_low, np.float32), np.asarray(action_high, np.float32)
    if not stochastic:
        return lambda obs: mean_env_action(arrays, obs, low, high)
    rng = np.random.default_rng(seed)
    return lambda obs: to_env_action(sample_actions(arrays, obs, rng)[0], low, high)


class PPOAgent(Agent):
    """BatchPPO in the learner service: reads the FIFO queue of T+1-step items,
    drops items older than `max_policy_lag` versions, and updates once a batch
    of `batch_env_steps` env steps (or `batch_episodes` episodes) is collected.

    With `synchronous` the actors collect each batch with the policy version
    that trains on it (textbook on-policy PPO, the control the asynchronous
    mode is measured against): the weights tell each actor how many items to
    write with their version (the batch's items shared out over the
    registered actors, rounded up) before it waits for the next version,
    and every item of an older version is dropped. Asynchronously, the actors
    collect ahead, but no further than the policy-lag limit: the weights give
    each actor its share of a batch per version (`item_credit`), and an actor
    that has written `max_policy_lag` + 1 shares beyond the versions it has
    received waits for the next one, so that no item it starts is consumed
    more than `max_policy_lag` versions later (items older than that, e.g.
    written before a share changed, are still dropped). In both modes, when
    the actors number fewer than the share was made for (one left or timed
    out) and no sample comes, the update runs on the items it has
    (`PPOConfig` refuses a synchronous batch triggered by episodes).
    """

    algo, table = "ppo", TABLE
    # An item can be a whole batch (the cleanrl preset's): every item held ahead is a policy version of lag
    # for the data behind it, so the sampler holds one, and the queue about a batch (`ppo_queue_items`).
    prefetch = 1
    metrics_every_update = True  # a row of diagnostics per update, as CleanRL and Stable-Baselines3 log them

    def __init__(self, spec: EnvSpec, config: PPOConfig, seed: int, total_steps: int = 0):
        self.spec, self.config, self.total_steps = spec, config, total_steps
        self.unroll_length = config.unroll_length
        self.ppo = BatchPPO(spec, config, seed)
        self._items, self._steps, self._episodes = [], 0, 0
        self._shared_by = 0  # the actors the latest share of a batch was made for (both modes)
        self.off_policy_env_steps = 0  # env steps trained on that an older policy version acted on (this process)
        # Env steps of the batches trained on so far (checkpointed): the learning-rate schedule's clock. The
        # count the actors report depends on when their heartbeats arrive, so a schedule run by it made two
        # runs of one seed differ from the first few updates on, even synchronously.
        # A Python int, mirrored into the variable only for checkpoints (an eager op per update grows the
        # learner's memory, see rlfleet.algorithms.ppo.learning.BatchPPO._update).
        self.trained_env_steps = 0
        self._trained_variable = tf.Variable(0, dtype=tf.int64, trainable=False)

    def signature(self) -> dict:
        c = self.config
        return ppo_signature(self.spec.obs_shape[0], self.spec.action_dim, c.envs_per_actor, c.unroll_length)

    def actor_network(self) -> dict:
        return dict(
            observation_shape=list(self.spec.obs_shape),
            action_dim=self.spec.action_dim,
            action_low=self.spec.action_low,
            action_high=self.spec.action_high,
            policy_hidden=list(self.config.policy_hidden),
            discount=self.config.discount,
        )

    def export_weights(self) -> dict:
        return self.ppo.export_weights()

    def checkpoint_items(self) -> dict:
        return dict(self.ppo.checkpoint_items(), trained_env_steps=self._trained_variable)

    def sync_to_checkpoint(self) -> None:
        self.ppo.sync_to_checkpoint()
        self._trained_variable.assign(self.trained_env_steps)

    def sync_from_checkpoint(self) -> None:
        self.ppo.sync_from_checkpoint()
        self.trained_env_steps = int(self._trained_variable.numpy())

    def samples(self, replay_address: str):
        """Yields the queue's items ({field: numpy array [T + 1, B, ...]}, `ppo_signature`) in the order they
        arrive, forever, through Reverb's tf.data dataset (`TrajectoryDataset`, its documented path for training)
        with one item in flight, so that no more items leave the queue than the learner is about to use. A
        dataset that waits on an empty queue for a second ends (Reverb's semantics) and is opened again, so that
        a learner whose actors have stopped exits promptly."""
        while True:
            dataset = reverb.TrajectoryDataset.from_table_signature(
                server_address=replay_address,
                table=TABLE,
                max_in_flight_samples_per_worker=1,
                num_workers_per_iterator=1,
                rate_limiter_timeout_ms=1000,
            )
            for sample in dataset:
                yield {k: v.numpy() for k, v in sample.data.items()}

    def items_per_actor(self, num_actors: int) -> int:
        """Synchronous: the batch's items shared out over `num_actors` (at least 1), rounded up; the count is
        kept for `on_idle`. With fewer items per batch than actors, some actors' items are dropped."""
        if not self.config.synchronous:
            return 0
        self._shared_by = max(1, num_actors)
        return -(-ppo_queue_items(self.config) // self._shared_by)

    def item_credit(self, num_actors: int) -> CreditLimit:
        """Asynchronous with `actor_credit`: the batch's items ÷ `num_actors` (at least 1) a version, up to
        `max_policy_lag` versions ahead;
        the count is kept for `on_idle`. Batches triggered by episodes only have no env-step size to share: no
        limit. Equal shares suit actors of one speed: where the actors, not the learner, are the bottleneck,
        a faster actor waits for a slower one's share (`actor_credit=false` lets it run free, at the price of
        items dropped for lag when the learner is the bottleneck)."""
        c = self.config
        if c.synchronous or not c.batch_env_steps or not c.actor_credit:
            return CreditLimit()
        self._shared_by = max(1, num_actors)
        return CreditLimit(ppo_queue_items(self.config) / self._shared_by, c.max_policy_lag)

    def consume(self, item, policy_version: int, env_steps: int) -> StepResult:
        c = self.config
        steps = (item["reward"].shape[0] - 1) * item["reward"].shape[1]
        versions = item["policy_version"][:-1]
        if c.synchronous:  # every step acted on by the version that trains on it
            stale = not np.all(versions == policy_version)
        else:
            stale = policy_version - int(versions.min()) > c.max_policy_lag
        if stale:
            return StepResult(dropped=steps)
        self._items.append(item)
        self._steps += steps
        self._episodes += int((item["terminated"][:-1] | item["truncated"][:-1]).sum())
        if not (
            (c.batch_env_steps and self._steps >= c.batch_env_steps)
            or (c.batch_episodes and self._episodes >= c.batch_episodes)
        ):
            return StepResult()
        return self._update(policy_version, env_steps)

    def on_idle(self, policy_version: int, env_steps: int, num_actors: int) -> StepResult | None:
        if self._items and num_actors < self._shared_by:
            return self._update(policy_version, env_steps)
        return None

    def _update(self, policy_version: int, env_steps: int) -> StepResult:
        """One update on the items collected; its metrics add the behaviour data's policy lag (versions
        behind `policy_version`, over env steps: mean and max, and the share of off-policy steps, lag > 0).
        The observation statistics travel with the weights, so the lag is also their age at the actors."""
        batch = {k: np.concatenate([it[k] for it in self._items], axis=1) for k in self._items[0]}
        # The schedule's clock is the env steps trained on before this batch (as CleanRL anneals by update
        # index): a function of the data, not of when heartbeats arrived, so a synchronous run is reproducible.
        done = self.trained_env_steps
        progress = min(1.0, done / self.total_steps) if self.total_steps else 0.0
        self.trained_env_steps += self._steps
        lag = policy_version - batch["policy_version"][:-1]
        self.off_policy_env_steps += int(np.count_nonzero(lag > 0))
        metrics = self.ppo.update(batch, progress)
        metrics.update(
            policy_lag_mean=float(lag.mean()),
            policy_lag_max=float(lag.max()),
            off_policy_fraction=float(np.mean(lag > 0)),
        )
        result = StepResult(
            gradient_steps=metrics["gradient_steps"], consumed=self._steps, updated=True, metrics=metrics
        )
        self._items, self._steps, self._episodes = [], 0, 0
        return result

    def policy(self, stochastic: bool, seed: int):
        return ppo_policy(self.export_weights(), stochastic, seed, self.spec.action_low, self.spec.action_high)

    def serving_module(self):
        from rlfleet.algorithms.ppo.export import PPOServing

        return PPOServing(self.export_weights(), self.spec)

    def evaluate(self, episodes: int, seed: int) -> list[float]:
        """The mean action's returns over `episodes` episodes, one after another (env seeds `seed` + i).

        Raises:
            EvaluationInterrupted: the learner is stopping (`rlfleet.algorithms.library.evaluation.STOP`).
        """
        return evaluate_policy(self.spec.env_id, self.policy(False, seed), episodes, seed, batched=False).returns

    def status_extras(self) -> dict:
        # β is a KL-penalty setting: under the clip objective there is none (status has no kl_beta).
        extras = {"kl_beta": self.ppo.beta} if self.ppo.config.policy_objective == "kl_penalty" else {}
        return dict(extras, off_policy_env_steps=self.off_policy_env_steps)
