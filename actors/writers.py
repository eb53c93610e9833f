"""What an algorithm's actor side (its behaviour policy and adder, `AlgorithmBuilder.behaviour` and `adder`) gets,
and the lag credit the adders share.

The collection loop (`rlfleet.actors.adders.collect(builder, actor, venv, weights, epoch)`) steps the batched env
`venv` with the behaviour policy and hands each step to the adder, which writes items into the run's replay table,
until `actor.stop` is set. What they get:
- `actor`: an `ActorContext`, all of the actor a writer may use (its attributes and methods below).
- `weights.latest`: the latest `rlfleet.actors.actor.Policy` (version, arrays: {name: numpy array} as the
  learner's `Agent.export_weights()` made them, exploration: the `Exploration` message its
  `Agent.exploration()` filled); the actor swaps new versions in between steps.
  `weights.items_per_actor(version)` is how many items the learner wants from each actor with that
  version (0: no limit), `weights.item_credit()` the asynchronous limit on running ahead
  (`ItemCredit`), `weights.serial` counts the weights messages received and
  `weights.wait_next(serial, stop, check)` waits for the next one (synchronous collection, as
  `rlfleet.actors.adders.SequenceAdder` does it).
- `epoch`: pass it to `actor.wait_written` and `actor.check_replay`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from rlfleet.algorithms.base import CreditLimit


class WeightsView(Protocol):
    """The actor's weights subscription as the behaviour policy and the adders see it (module doc)."""

    serial: int  # weights messages received
    resends: int  # weights messages that were not newer than the one before (a restarted learner)

    @property
    def latest(self):
        """The latest `rlfleet.actors.actor.Policy` (version, arrays, exploration)."""

    def items_per_actor(self, version: int) -> int:
        """Items the learner wants from each actor with policy `version` (0: no limit, asynchronous)."""

    def item_credit(self) -> CreditLimit:
        """The asynchronous limit on running ahead (`ItemCredit`)."""

    def wait_next(self, serial: int, stop, check: Callable[[], None]) -> bool:
        """Waits for a weights message after the `serial`-th; False when `stop` (an Event) is set first; calls
        `check` while it waits (it raises to end the wait)."""


class ItemCredit:
    """How many more replay items an asynchronous actor may start (flow control by policy version).

    The learner trains one batch per policy version and gives each actor a share of it, `item_share` items per
    version (`CreditLimit`, sent as `Weights.item_share` and `Weights.max_policy_lag`). The actor may hold
    `item_share` × (`max_policy_lag` + 1) items beyond the versions it has received: each newer version it
    receives gives back `item_share` items per version it advanced. With every actor keeping to it, an item
    started with version v belongs to a batch trained by version v + `max_policy_lag` at the latest, so the
    learner never has to drop it for lag however much faster the actors are than the learner. A share of 0 means
    no limit.
    """

    def __init__(self):
        self.version, self.resends, self.share, self.items = 0, 0, 0.0, 0.0

    def see(self, version: int, limit: CreditLimit, resends: int = 0) -> None:
        """Takes the latest policy `version`, with its credit `limit`, into account. `resends` counts the
        weights messages that were not newer than the one before (`weights.resends`): a restarted learner sends
        its checkpoint's version again and may have lost the items it held, so a resend, like the first limit,
        gives a full window. Limits (see the class doc): item_share ≥ 0, max_policy_lag ≥ 0."""
        share = limit.item_share
        window = max(1.0, share * (limit.max_policy_lag + 1))
        if self.share <= 0 or resends != self.resends:
            self.items = window
        elif version > self.version:
            self.items = min(window, self.items + share * (version - self.version))
        else:
            self.items = min(window, self.items)
        self.version, self.resends, self.share = version, resends, share

    def available(self) -> bool:
        """True if an item may start now."""
        return self.share <= 0 or self.items >= 1.0 - 1e-9

    def take(self) -> None:
        """Counts an item started."""
        if self.share > 0:
            self.items -= 1.0


class ActorContext:
    """What an actor gives its behaviour policy and adder: the run's settings, where to write, when to stop, and
    the checks and bookkeeping of every batch step.

    Attributes:
        config: the run's `RunConfig` message (env_id, table, num_envs, unroll_length, seed).
        net: the `NetworkSpec` message the learner's `Agent.actor_network()` filled.
        frame_stack: frames per observation (1 for vector observations).
        replay_address: host:port of the replay server to write to.
        stop: a threading.Event, set when the writer must return.
        policy_version: set it to the policy version each step is acted with (heartbeats report it).
        episode_steps: int64 [B], the steps each env has taken in its current episode (0 before its first).
    Methods (the actor's own):
        start_episodes(venv) -> (rng, first observations): seeds the behaviour policy's RNG and resets the envs.
        check_finite(obs, reward=None): raises ActorError on NaN/inf env output, before it is written.
        check_policy_output(version, *values): raises ActorError, naming the learner, on NaN/inf policy output.
        wait_written(writer, epoch, in_flight=1) -> bool: rate-limiter backpressure (False: stopping); raises
            ReplayLost after a replay restart or when the writers' connection died.
        check_replay(epoch): raises ReplayLost when the replay server restarted since `epoch`.
        count_steps(reward, done): env-step and episode-return bookkeeping of one batch step.
    """

    def __init__(self, actor):
        self._actor = actor
        self.config, self.net, self.frame_stack = actor.config, actor.net, actor.frame_stack
        self.replay_address, self.stop = actor.replay_address, actor.stop
        self.start_episodes, self.check_finite = actor.start_episodes, actor.check_finite
        self.check_policy_output, self.wait_written = actor.check_policy_output, actor.wait_written
        self.check_replay, self.count_steps = actor.check_replay, actor.count_steps

    @property
    def policy_version(self) -> int:
        return self._actor.policy_version

    @property
    def episode_steps(self):
        return self._actor.episode_steps

    @policy_version.setter
    def policy_version(self, version: int) -> None:
        self._actor.policy_version = version
