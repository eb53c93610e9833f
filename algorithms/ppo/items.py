"""BatchPPO's replay item, end to end: the table (a FIFO queue), the item's signature, and the actor-side writer
that makes items.

One FIFO queue table (`reverb.Table.queue`): every item is sampled exactly once, and its `Queue` rate limiter
blocks actors' inserts while the table is full, so actors can run at most `queue_items` items ahead of the
learner. The table signature makes Reverb reject items of the wrong shape or dtype at insert. The learner reads
the items back in `rlfleet.algorithms.ppo.agent.PPOAgent`.

The table's side (`ppo_signature`, `ppo_tables`) imports TensorFlow and Reverb's Python package when called; the
writer's side imports neither (it writes through `rlfleet.actors.replay_client`), so an actor running it never
loads TensorFlow's Python.
"""

from __future__ import annotations

import collections

import numpy as np

from rlfleet.actors.replay_client import Client
from rlfleet.actors.writers import ItemCredit
from rlfleet.algorithms.ppo.policy import sample_actions, to_env_action
from rlfleet.envs.core import truncation_observations

TABLE = "ppo_trajectories"


def ppo_signature(obs_dim: int, action_dim: int, num_envs: int, unroll_length: int) -> dict:
    """Signature of one PPO item: T+1 consecutive batch steps of one actor.

    Every field has leading shape [T+1, B] (T = `unroll_length`, B = `num_envs`);
    the last step is only used for its observation (the bootstrap value).
    Step t holds the observation the action was chosen on, the (unclipped)
    sampled action, the reward that followed, `terminated` (the episode
    reached a terminal state after step t: nothing is bootstrapped) and
    `truncated` (it was cut by a time limit after step t: the return is
    bootstrapped from V(final_observation)), and the behaviour policy's
    log-prob, mean, log-std and version. `final_observation` holds the
    episode's last observation where `truncated` (the env reset replaced it
    in the next step's `observation`) and zeros elsewhere (zeros compress to
    almost nothing in Reverb's chunks). `discounted_return` is the env's
    discounted return so far in its episode, G_t = r_t + γ·G_{t−1} (γ the
    run's discount; what `reward_scale = "return"` scales rewards by).
    """
    import tensorflow as tf

    lead = [unroll_length + 1, num_envs]
    f32 = tf.float32
    return {
        "observation": tf.TensorSpec(lead + [obs_dim], f32),
        "action": tf.TensorSpec(lead + [action_dim], f32),
        "reward": tf.TensorSpec(lead, f32),
        "terminated": tf.TensorSpec(lead, tf.bool),
        "truncated": tf.TensorSpec(lead, tf.bool),
        "final_observation": tf.TensorSpec(lead + [obs_dim], f32),
        "discounted_return": tf.TensorSpec(lead, f32),
        "behaviour_log_prob": tf.TensorSpec(lead, f32),
        "behaviour_mean": tf.TensorSpec(lead + [action_dim], f32),
        "behaviour_log_std": tf.TensorSpec(lead + [action_dim], f32),
        "policy_version": tf.TensorSpec(lead, tf.int64),
    }


def ppo_tables(obs_dim: int, action_dim: int, num_envs: int, unroll_length: int, queue_items: int) -> list:
    """The PPO replay tables (one queue of at most `queue_items` items).

    Raises:
        ValueError: non-positive sizes.
    """
    for name, v in (
        ("obs_dim", obs_dim),
        ("action_dim", action_dim),
        ("num_envs", num_envs),
        ("unroll_length", unroll_length),
        ("queue_items", queue_items),
    ):
        if v <= 0:
            raise ValueError(f"replay: {name} must be positive, got {v}")
    import reverb

    return [
        reverb.Table.queue(
            TABLE, max_size=queue_items, signature=ppo_signature(obs_dim, action_dim, num_envs, unroll_length)
        )
    ]


def ppo_tables_for(spec, config, queue_items: int | None = None) -> list:
    """PPO's tables for an env spec and a `PPOConfig` (queue capacity: `queue_items`, else one update batch)."""
    items = queue_items or ppo_queue_items(config)
    return ppo_tables(spec.obs_shape[0], spec.action_dim, config.envs_per_actor, config.unroll_length, items)


def ppo_queue_items(config) -> int:
    """Default PPO queue capacity: the items of one update batch (at least 1). Items queued beyond a batch
    would be acted on by a policy a version or more older than the one trained when they are read."""
    per_item = config.envs_per_actor * config.unroll_length
    steps = config.batch_env_steps or 1000 * max(config.batch_episodes, 1)
    return max(1, -(-steps // per_item))


def collect_trajectories(actor, venv, weights, epoch: int) -> None:
    """BatchPPO: one writer for the batch; an item of T+1 batch steps every T steps.

    Terminations and truncations are written apart: at a time limit the
    step also carries the episode's true last observation
    (`final_observation`), which the learner bootstraps from
    (`ppo_signature`).

    Consecutive items share a step: the last step of one, used only for its
    observation (the bootstrap value), is the first of the next. Which steps
    make an item under synchronous and asynchronous collection: `_ItemWriter`.
    """
    cfg = actor.config
    b = cfg.num_envs
    rng, obs = actor.start_episodes(venv)
    discount = actor.net.discount
    low = np.asarray(actor.net.action_low, np.float32)
    high = np.asarray(actor.net.action_high, np.float32)
    discounted_return = np.zeros(b, np.float64)  # per env, since its episode started
    items = _ItemWriter(actor, weights, epoch)
    try:
        while not actor.stop.is_set():
            serial = weights.serial  # read first: a message in between only ends a wait early
            version, arrays, _ = weights.latest
            items.before_step(version)
            actor.policy_version = version
            action, log_prob, mean, log_std = sample_actions(arrays, obs, rng)
            actor.check_policy_output(version, action, log_prob)
            next_obs, reward, terminated, truncated, info = venv.step(to_env_action(action, low, high))
            final_obs = truncation_observations(next_obs, terminated, truncated, info)
            actor.check_finite(next_obs, reward)
            actor.check_finite(final_obs)  # the true last observations at truncations
            done = np.logical_or(terminated, truncated)
            discounted_return = discount * discounted_return + reward
            step = _step_record(obs, (action, log_prob, mean, log_std), (reward, terminated, truncated, final_obs))
            step.update(
                discounted_return=discounted_return.astype(np.float32), policy_version=np.full(b, version, np.int64)
            )
            if not items.append(step, version, serial):
                break
            obs = next_obs
            discounted_return[done] = 0.0
            actor.count_steps(reward, done)
    finally:
        items.close()


def _step_record(obs, behaviour: tuple, outcome: tuple) -> dict:
    """One batch step's columns of `ppo_signature` (but the discounted return and the policy version):
    `behaviour` = (action, log-prob, mean, log-std) of the behaviour policy, `outcome` = (reward, terminated,
    truncated, final observation) of the env step. A step that terminated is never also truncated."""
    action, log_prob, mean, log_std = behaviour
    reward, terminated, truncated, final_obs = outcome
    return dict(
        observation=np.asarray(obs, np.float32),
        action=action,
        reward=np.asarray(reward, np.float32),
        terminated=np.asarray(terminated, bool),
        truncated=np.asarray(truncated, bool) & ~np.asarray(terminated, bool),
        final_observation=final_obs,
        behaviour_log_prob=log_prob,
        behaviour_mean=mean,
        behaviour_log_std=log_std,
    )


class _ItemWriter:
    """`collect_trajectories`' one writer: which appended step starts the next item, which policy version a
    synchronous item belongs to, and the asynchronous `ItemCredit`.

    When the learner collects synchronously (`weights.items_per_actor` > 0), every item's steps (all but the
    last one, used only for its observation) are acted on by one policy version: the actor writes the learner's
    share of items with a version and then waits for the next weights message; the step it had taken by then
    was acted on by the old version, so it only ends the item before, and the next item starts at the step
    after it. Steps of a version that a newer one replaced before they filled an item are never written into
    one. When it collects asynchronously, the actor starts an item only with `ItemCredit` for it; without, it
    waits for newer versions and the next item starts at the step after the wait, as above.
    """

    def __init__(self, actor, weights, epoch: int):
        self.actor, self.weights, self.epoch = actor, weights, epoch
        self.t = actor.config.unroll_length
        self.client = Client(actor.replay_address)
        self.writer = self.client.trajectory_writer(num_keep_alive_refs=self.t + 1)
        self.appended = self.item_start = 0  # steps appended; where the next item starts
        self.item_version = None  # synchronous collection: the policy version of the item being collected
        self.items_of_version = collections.Counter()
        self.credit = ItemCredit()  # asynchronous collection's limit on running ahead of the learner

    def _see_credit(self, version: int) -> None:
        self.credit.see(version, self.weights.item_credit(), self.weights.resends)

    def before_step(self, version: int) -> None:
        """Before a step acted on by `version`: takes credit when it starts an item; synchronously, a new
        version starts a new item (its steps all of one version)."""
        if self.appended == self.item_start:  # this step starts an item (the first, or the first after a wait)
            self._see_credit(version)
            self.credit.take()
        if self.weights.items_per_actor(version) and version != self.item_version:
            if self.appended - self.item_start != self.t:  # not the step that ends an item: start a new one here
                self.item_start = self.appended
            if self.appended == self.item_start:
                self.item_version = version

    def append(self, step: dict, version: int, serial: int) -> bool:
        """Appends a step acted on by `version` (`serial`: the weights messages seen before it); makes an item
        when T+1 steps are in, then waits as the collection mode asks. Returns False when the actor stops."""
        t, weights = self.t, self.weights
        self.writer.append(step)
        self.appended += 1
        if self.appended - self.item_start != t + 1:
            return True
        self.writer.create_item(
            self.actor.config.table, 1.0, {k: col[-(t + 1) :] for k, col in self.writer.history.items()}
        )
        written = self.item_version if self.item_version is not None else version
        self.item_start, self.item_version = self.appended - 1, version
        self.items_of_version[written] += 1
        self._see_credit(version)  # at item starts only: not per step
        limit = weights.items_per_actor(written)
        if limit and self.items_of_version[written] >= limit:
            if not self.actor.wait_written(self.writer, self.epoch, in_flight=0):
                return False
            if not weights.wait_next(serial, self.actor.stop, lambda: self.actor.check_replay(self.epoch)):
                return False
            self.item_start, self.item_version = self.appended, None
            self.items_of_version.clear()
        elif self.credit.available():  # the step just taken starts the next item too
            self.credit.take()
            if not self.actor.wait_written(self.writer, self.epoch):
                return False
        else:  # asynchronous and as far ahead as the policy-lag limit lets it run
            if not self.actor.wait_written(self.writer, self.epoch, in_flight=0) or not self._wait_for_credit():
                return False
            self.item_start = self.appended
        return True

    def _wait_for_credit(self) -> bool:
        """Waits for weights messages until an item may start; False if the actor stops first."""
        weights = self.weights
        while True:
            serial, version = weights.serial, weights.latest.version
            self._see_credit(version)
            if self.credit.available():
                return True
            if not weights.wait_next(serial, self.actor.stop, lambda: self.actor.check_replay(self.epoch)):
                return False

    def close(self) -> None:
        """Closes the writer without a flush: at shutdown the queue may be full and nobody samples it. Nothing may
        keep the client alive (an exception's traceback holds the writer's frame): while it lives, a new client
        to the same address reuses its connection, which may be the dead one the actor replaces."""
        self.writer.close()
        self.writer = self.client = None
