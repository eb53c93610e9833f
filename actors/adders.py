"""Generic replay writers (adders, as Acme calls them) and the actor's one collection loop.

An algorithm's actor side is configuration: its builder gives a behaviour policy (`AlgorithmBuilder.behaviour`:
one call per batch step, returning an `Act`) and an adder (`AlgorithmBuilder.adder`), and `collect` steps the
envs, hands each batch step to the adder and stops when the actor does. The adders own their item layouts, the
tables' signatures included, so that what the actors write and what the replay server checks are defined once:

- `SequenceAdder`: items of T + 1 consecutive batch steps of all of an actor's envs, consecutive items sharing
  a step (T = the run's unroll length), with synchronous collection (one policy version per item) and the
  asynchronous lag credit (`ItemCredit`) built in. On-policy algorithms (BatchPPO) read them.
- `WindowAdder`: after every batch step, one item per group of G envs holding the last `span` steps of those
  envs, consecutive items overlapping (Reverb stores each step once). Off-policy algorithms (DQN) decode n-step
  transitions from them.

Nothing here imports TensorFlow's Python: the writers are Reverb's own, loaded through
`rlfleet.actors.replay_client`; the signature functions import TensorFlow when called (by the replay server and
the learner, never by an actor).
"""

from __future__ import annotations

import collections
from typing import NamedTuple, Protocol

import numpy as np

from rlfleet.actors.replay_client import Client
from rlfleet.actors.writers import ItemCredit
from rlfleet.envs.core import policy_observations, truncation_observations

# How a step ended its episode, in a `WindowAdder` item's `end` field: it did not; the env terminated (a terminal
# state: nothing to bootstrap from); the episode was cut (a time limit, or a padding step before the first
# observation of an actor's writer): no terminal state, but the next step is another episode's.
NOT_ENDED, TERMINATED, TRUNCATED = 0, 1, 2


class EnvStepError(Exception):
    """The batched env raised in `step` (its `__cause__` is what it raised): the env's fault, not the loop's."""


class Act(NamedTuple):
    """What a behaviour policy decided for one batch step of B envs.

    env_action: what the batched env's `step` takes ([B] int for discrete actions, [B, A] float for Box ones).
    action: the action as the items record it ([B] or [B, A]; e.g. PPO's unclipped Gaussian sample).
    extras: further columns of the step, {name: [B, ...] array} (e.g. the behaviour policy's log-probability);
        the table's signature must have each.
    """

    env_action: np.ndarray
    action: np.ndarray
    extras: dict


class Step(NamedTuple):
    """One batch step as an adder receives it: the observations [B, ...] the action was chosen on, the `Act`,
    and what `venv.step` returned (rewards [B], terminated [B], truncated [B], the step's info)."""

    observation: np.ndarray
    act: Act
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    info: dict
    next_observation: np.ndarray


class Adder(Protocol):
    """What the collection loop (`collect`) calls of a replay writer, in this order: `start` once, then per batch
    step `before_step` and `add` (False: the actor stops), and `close` at the end whatever happened."""

    def start(self, obs: np.ndarray) -> None:
        """Before the first step, with the first observations [B, ...]."""

    def before_step(self, version: int) -> None:
        """Before a batch step acted on by policy `version`."""

    def add(self, step: Step, version: int, serial: int) -> bool:
        """Writes a batch step acted on by `version` (`serial`: the weights messages seen before it); False when
        the actor stops."""

    def close(self) -> None:
        """Closes the writers (no flush)."""


def collect(builder, actor, venv, weights, epoch: int) -> None:
    """The actor's collection loop: steps the batched env `venv` with `builder`'s behaviour policy on the latest
    weights and hands every batch step to `builder`'s adder until `actor.stop` is set or the adder says the actor
    stops. `actor`, `weights` and `epoch` are as `rlfleet.actors.writers` describes them.

    Raises:
        ActorError: NaN/inf env output (`actor.check_finite`) or policy output (the behaviour's checks).
        ReplayLost: the replay server restarted or the writers' connection died.
        EnvStepError: the env raised in its step.
    """
    act = builder.behaviour(actor)
    rng, obs = actor.start_episodes(venv)
    obs = policy_observations(obs)  # float32, as the learner and evaluation act on them
    adder = builder.adder(actor, weights, epoch)
    try:
        adder.start(obs)
        while not actor.stop.is_set():
            serial = weights.serial  # read first: a message in between only ends a wait early
            policy = weights.latest
            adder.before_step(policy.version)
            actor.policy_version = policy.version
            a = act(policy, obs, rng)
            try:
                next_obs, reward, terminated, truncated, info = venv.step(a.env_action)
            except Exception as e:  # a user's env that raises
                raise EnvStepError(f"{type(e).__name__}: {e}") from e
            next_obs = policy_observations(next_obs)  # (a float64 value beyond float32's range: not finite)
            actor.check_finite(next_obs, reward)
            if not adder.add(Step(obs, a, reward, terminated, truncated, info, next_obs), policy.version, serial):
                break
            obs = next_obs
            actor.count_steps(reward, np.logical_or(terminated, truncated))
    finally:
        adder.close()


def sequence_signature(observation, action, num_envs: int, length: int, extras: dict, **options) -> dict:
    """The table signature of `SequenceAdder` items: every field [length, num_envs, ...].

    Args:
        observation, action: `tf.TensorSpec`s of one env's observation and recorded action (shape and dtype).
        num_envs: B, the envs of an actor; length: T + 1, the batch steps of an item.
        extras: {name: `tf.TensorSpec` of one env's value} of the behaviour's `Act.extras`.
        options: the adder's `final_observation` and `discounted_return` (see `SequenceAdder`).
    Returns:
        {"observation", "action", "reward" (float32), "terminated", "truncated" (bool), ["final_observation"],
        [*extras], ["discounted_return" (float32)], "policy_version" (int64): tf.TensorSpec}.
    """
    import tensorflow as tf

    lead = [length, num_envs]

    def spec(one):
        return tf.TensorSpec(lead + list(one.shape), one.dtype)

    out = {
        "observation": spec(observation),
        "action": spec(action),
        "reward": tf.TensorSpec(lead, tf.float32),
        "terminated": tf.TensorSpec(lead, tf.bool),
        "truncated": tf.TensorSpec(lead, tf.bool),
    }
    if options.get("final_observation"):
        out["final_observation"] = spec(observation)
    out.update({name: spec(one) for name, one in extras.items()})
    if options.get("discounted_return") is not None:
        out["discounted_return"] = tf.TensorSpec(lead, tf.float32)
    out["policy_version"] = tf.TensorSpec(lead, tf.int64)
    return out


class SequenceAdder:
    """Items of T + 1 consecutive batch steps of all of an actor's B envs (T = `actor.config.unroll_length`),
    written to `actor.config.table`; the last step of an item, there for its observation (a bootstrap value), is
    the first of the next. Layout: `sequence_signature`.

    Columns per step: the observation (float32) the action was chosen on, the `Act`'s action and extras, the
    reward (float32) that followed, `terminated` (a terminal state followed) and `truncated` (a time limit cut the
    episode; never set with `terminated`), the policy version that acted; with `final_observation`, the episode's
    true last observation where truncated (zeros elsewhere: the reset replaced it in the next step's
    observation); with `discounted_return` = γ, the env's discounted return so far in its episode,
    G_t = r_t + γ·G_{t−1} (what BatchPPO's `reward_scale = "return"` scales rewards by).

    Which steps make an item: when the learner collects synchronously (`weights.items_per_actor` > 0), every
    item's steps (all but the last one, used only for its observation) are acted on by one policy version: the
    actor writes the learner's share of items with a version and then waits for the next weights message; the
    step it had taken by then was acted on by the old version, so it only ends the item before, and the next item
    starts at the step after it. Steps of a version that a newer one replaced before they filled an item are
    never written into one. When it collects asynchronously, the actor starts an item only with `ItemCredit` for
    it; without, it waits for newer versions and the next item starts at the step after the wait, as above.
    """

    def __init__(self, actor, weights, epoch: int, final_observation: bool = False, discounted_return=None):
        self.actor, self.weights, self.epoch = actor, weights, epoch
        self.final_observation, self.discount = final_observation, discounted_return
        self.t = actor.config.unroll_length
        self.client = Client(actor.replay_address)
        self.writer = self.client.trajectory_writer(num_keep_alive_refs=self.t + 1)
        self.appended = self.item_start = 0  # steps appended; where the next item starts
        self.item_version = None  # synchronous collection: the policy version of the item being collected
        self.items_of_version = collections.Counter()
        self.credit = ItemCredit()  # asynchronous collection's limit on running ahead of the learner
        self.running_return = None

    def start(self, obs) -> None:
        """Before the first step, with the first observations [B, ...]."""
        self.running_return = np.zeros(len(obs), np.float64)

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

    def _columns(self, step: Step, version: int) -> dict:
        terminated = np.asarray(step.terminated, bool)
        out = dict(
            observation=np.asarray(step.observation, np.float32),
            action=step.act.action,
            reward=np.asarray(step.reward, np.float32),
            terminated=terminated,
            truncated=np.asarray(step.truncated, bool) & ~terminated,
        )
        if self.final_observation:
            final_obs = truncation_observations(step.next_observation, step.terminated, step.truncated, step.info)
            self.actor.check_finite(final_obs)  # the true last observations at truncations
            out["final_observation"] = final_obs
        out.update(step.act.extras)
        if self.discount is not None:
            self.running_return = self.discount * self.running_return + step.reward
            out["discounted_return"] = self.running_return.astype(np.float32)
            self.running_return[np.logical_or(step.terminated, step.truncated)] = 0.0
        out["policy_version"] = np.full(len(terminated), version, np.int64)
        return out

    def add(self, step: Step, version: int, serial: int) -> bool:
        """Appends a step acted on by `version` (`serial`: the weights messages seen before it); makes an item
        when T+1 steps are in, then waits as the collection mode asks. Returns False when the actor stops."""
        t, weights = self.t, self.weights
        self.writer.append(self._columns(step, version))
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


def window_signature(frame, num_envs: int, span: int) -> dict:
    """The table signature of `WindowAdder` items: fields [span, G, ...] (G = `num_envs` envs per item).

    Args:
        frame: `tf.TensorSpec` of one env's newest frame (its whole observation when frames are not stacked).
    Returns:
        {"observation": [span, G, *frame], "action": int32 [span, G], "reward": float32 [span, G], "end": int8
        [span, G] (`NOT_ENDED`, `TERMINATED`, `TRUNCATED`), "policy_version": int64 [span] (one behaviour policy
        per batch step)}.
    """
    import tensorflow as tf

    lead = [span, num_envs]
    return {
        "observation": tf.TensorSpec(lead + list(frame.shape), frame.dtype),
        "action": tf.TensorSpec(lead, tf.int32),
        "reward": tf.TensorSpec(lead, tf.float32),
        "end": tf.TensorSpec(lead, tf.int8),
        "policy_version": tf.TensorSpec(lead[:1], tf.int64),
    }


class WindowAdder:
    """After every batch step, one item per group of G envs (`actor.config.envs_per_item`) holding the last
    `span` steps of those envs side by side (layout: `window_signature`), written to `actor.config.table`.

    Columns per step: the newest frame of the observation the action was chosen on (the whole observation,
    float32, when `frame_stack` is 1), the action (int32), the reward (float32) that followed and how the step
    ended its episode (`end`), and the policy version that acted. A writer starts with `frame_stack` − 1 padding
    steps (zero frames, `TRUNCATED`), so that the items' frames before an episode's first step are the zeros the
    policy saw stacked and the first real step already starts an item (as its step S − 1, the transition it
    stands for). An actor runs ahead of the replay
    table's rate limiter by at most `in_flight` items per writer.
    """

    def __init__(self, actor, epoch: int, span: int, frame_stack: int = 1, in_flight: int = 1):
        cfg = actor.config
        self.actor, self.epoch, self.span, self.stack, self.in_flight = actor, epoch, span, frame_stack, in_flight
        self.g, self.table = cfg.envs_per_item or 1, cfg.table
        if cfg.num_envs % self.g:
            raise ValueError(f"the run's items hold {self.g} envs each, which does not divide this actor's "
                             f"{cfg.num_envs} envs")  # fmt: skip
        self.client = Client(actor.replay_address)
        self.writers = [self.client.trajectory_writer(num_keep_alive_refs=span) for _ in range(cfg.num_envs // self.g)]

    def start(self, obs) -> None:
        """Before the first step, with the first observations [B, ...]: the padding steps."""
        frame_shape = obs.shape[2:] if self.stack > 1 else obs.shape[1:]
        padding = dict(
            observation=np.zeros((self.g, *frame_shape), np.float32 if self.stack == 1 else obs.dtype),
            action=np.zeros(self.g, np.int32),
            reward=np.zeros(self.g, np.float32),
            end=np.full(self.g, TRUNCATED, np.int8),
            policy_version=np.int64(-1),
        )
        for writer in self.writers:
            for _ in range(self.stack - 1):
                writer.append(padding)

    def before_step(self, version: int) -> None:
        """Nothing to do: items do not depend on the policy version (every step, once a writer holds `span`
        steps, makes one)."""

    def add(self, step: Step, version: int, serial: int) -> bool:
        """Appends a batch step acted on by `version` to the writers, G envs each, makes an item of each writer's
        last `span` steps once it has that many, and waits for the replay server (rate limiter). Returns False
        when the actor stops."""
        obs = step.observation
        end = np.where(step.terminated, TERMINATED, np.where(step.truncated, TRUNCATED, NOT_ENDED)).astype(np.int8)
        columns = dict(
            observation=np.asarray(obs, np.float32) if self.stack == 1 else obs[:, -1],  # the newest frame
            action=np.asarray(step.act.action, np.int32),
            reward=np.asarray(step.reward, np.float32),
            end=end,
        )
        g, span = self.g, self.span
        for k, writer in enumerate(self.writers):
            part = slice(k * g, (k + 1) * g)
            writer.append({**{key: col[part] for key, col in columns.items()}, "policy_version": np.int64(version)})
            if writer.episode_steps >= span:
                writer.create_item(self.table, 1.0, {key: col[-span:] for key, col in writer.history.items()})
        return all(self.actor.wait_written(w, self.epoch, in_flight=self.in_flight) for w in self.writers)

    def close(self) -> None:
        """Closes the writers without a flush: at shutdown the rate limiter may block inserts for good (and, as
        `SequenceAdder.close`, nothing may keep the client alive)."""
        for writer in self.writers:
            writer.close()
        self.writers.clear()
        self.client = None
