"""The built-in actor-side writers (`rlfleet.algorithms.Algorithm.collect`).

A writer is a function `collect(actor, venv, weights, epoch)` that steps the batched env `venv` with the
behaviour policy and writes items into the run's replay table until `actor.stop` is set. What it gets:
- `actor` (`rlfleet.actors.actor.Actor`): `config` (the run's `RunConfig`: table, num_envs,
  unroll_length, seed), `net` (the `NetworkSpec` message the learner's `Agent.actor_network()` filled),
  `replay_address`, `stop`
  (a threading.Event), and the helpers `start_episodes(venv) -> (rng, first observations)`,
  `check_finite(obs, reward=None)` (raises ActorError on NaN/inf env output, before it is written),
  `check_policy_output(version, *values)` (raises ActorError, naming the learner, on NaN/inf policy output),
  `wait_written(writer, epoch, in_flight)` (rate-limiter backpressure; raises ReplayLost after a replay
  restart), `count_steps(reward, done)` (env-step and episode-return bookkeeping); set
  `actor.policy_version` to the version acted with.
- `weights.latest`: the latest `rlfleet.actors.actor.Policy` (version, arrays: {name: numpy array} as the
  learner's `Agent.export_weights()` made them, exploration: the `Exploration` message its
  `Agent.exploration()` filled); the actor swaps new versions in between steps.
  `weights.items_per_actor(version)` is how many items the learner wants from each actor with that
  version (0: no limit), `weights.item_credit()` the asynchronous limit on running ahead
  (`ItemCredit`), `weights.serial` counts the weights messages received and
  `weights.wait_next(serial, stop, check)` waits for the next one (synchronous collection, as
  `collect_trajectories` does it; `actor.check_replay(epoch)` raises ReplayLost after a replay restart).
- `epoch`: pass it to `wait_written`.
"""

from __future__ import annotations

import collections

import numpy as np
import reverb

from rlfleet.actors.envs import truncation_observations
from rlfleet.actors.policy import epsilon_greedy_q, q_values, sample_actions, to_env_action


class ItemCredit:
    """How many more replay items an asynchronous actor may start (flow control by policy version).

    The learner trains one batch per policy version and gives each actor a share of it, `share` items per
    version (`Weights.item_share`). The actor may hold `share` × (`ahead` + 1) items beyond the versions it
    has received (`Weights.versions_ahead`, the learner's `max_policy_lag`): each newer version it receives
    gives back `share` items per version it advanced. With every actor keeping to it, an item started with
    version v belongs to a batch trained by version v + `ahead` at the latest, so the learner never has to drop
    it for lag however much faster the actors are than the learner. A share of 0 means no limit.
    """

    def __init__(self):
        self.version, self.resends, self.share, self.items = 0, 0, 0.0, 0.0

    def see(self, version: int, share: float, ahead: int, resends: int = 0) -> None:
        """Takes the latest policy `version`, with its item `share` and versions `ahead`, into account.
        `resends` counts the weights messages that were not newer than the one before (`weights.resends`): a
        restarted learner sends its checkpoint's version again and may have lost the items it held, so a
        resend, like the first limit, gives a full window. Limits (see the class doc): share ≥ 0, ahead ≥ 0."""
        window = max(1.0, share * (ahead + 1))
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


def collect_trajectories(actor, venv, weights, epoch: int) -> None:
    """BatchPPO: one writer for the batch; an item of T+1 batch steps every T steps.

    Terminations and truncations are written apart: at a time limit the
    step also carries the episode's true last observation
    (`final_observation`), which the learner bootstraps from
    (`rlfleet.replay.server.ppo_signature`).

    Consecutive items share a step: the last step of one, used only for its
    observation (the bootstrap value), is the first of the next. When the
    learner collects synchronously (`weights.items_per_actor` > 0), every
    item's steps (all but that last one) are acted on by one policy version:
    the actor writes the learner's share of items with a version and then
    waits for the next weights message; the step it had taken by then was
    acted on by the old version, so it only ends the item before, and the
    next item starts at the step after it. Steps of a version that a newer
    one replaced before they filled an item are never written into one.
    When it collects asynchronously, the actor starts an item only with
    `ItemCredit` for it; without, it waits for newer versions and the next
    item starts at the step after the wait, as above.
    """
    cfg = actor.config
    t, b = cfg.unroll_length, cfg.num_envs
    rng, obs = actor.start_episodes(venv)
    discount = actor.net.discount
    low = np.asarray(actor.net.action_low, np.float32)
    high = np.asarray(actor.net.action_high, np.float32)
    discounted_return = np.zeros(b, np.float64)  # per env, since its episode started
    client = reverb.Client(actor.replay_address)
    appended = item_start = 0  # steps appended; where the next item starts
    item_version = None  # synchronous collection: the policy version of the item being collected
    items_of_version = collections.Counter()
    credit = ItemCredit()  # asynchronous collection's limit on running ahead of the learner
    writer = client.trajectory_writer(num_keep_alive_refs=t + 1)

    def wait_for_credit() -> bool:
        """Waits for weights messages until an item may start; False if the actor stops first."""
        while True:
            serial, version = weights.serial, weights.latest.version
            credit.see(version, *weights.item_credit(), weights.resends)
            if credit.available():
                return True
            if not weights.wait_next(serial, actor.stop, lambda: actor.check_replay(epoch)):
                return False

    try:
        while not actor.stop.is_set():
            serial = weights.serial  # read first: a message in between only ends a wait early
            version, arrays, _ = weights.latest
            if appended == item_start:  # this step starts an item (the first, or the first after a wait)
                credit.see(version, *weights.item_credit(), weights.resends)
                credit.take()
            if weights.items_per_actor(version) and version != item_version:
                if appended - item_start != t:  # not the step that ends an item: start a new one here
                    item_start = appended
                if appended == item_start:
                    item_version = version
            actor.policy_version = version
            action, log_prob, mean, log_std = sample_actions(arrays, obs, rng)
            actor.check_policy_output(version, action, log_prob)
            next_obs, reward, terminated, truncated, info = venv.step(to_env_action(action, low, high))
            final_obs = truncation_observations(next_obs, terminated, truncated, info)
            actor.check_finite(next_obs, reward)
            actor.check_finite(final_obs)  # the true last observations at truncations
            done = np.logical_or(terminated, truncated)
            discounted_return = discount * discounted_return + reward
            writer.append(
                dict(
                    observation=np.asarray(obs, np.float32),
                    action=action,
                    reward=np.asarray(reward, np.float32),
                    terminated=np.asarray(terminated, bool),
                    truncated=np.asarray(truncated, bool) & ~np.asarray(terminated, bool),
                    final_observation=final_obs,
                    discounted_return=discounted_return.astype(np.float32),
                    behaviour_log_prob=log_prob,
                    behaviour_mean=mean,
                    behaviour_log_std=log_std,
                    policy_version=np.full(b, version, np.int64),
                )
            )
            appended += 1
            if appended - item_start == t + 1:
                writer.create_item(cfg.table, 1.0, {k: col[-(t + 1) :] for k, col in writer.history.items()})
                written = item_version if item_version is not None else version
                item_start, item_version = appended - 1, version
                items_of_version[written] += 1
                credit.see(version, *weights.item_credit(), weights.resends)  # at item starts only: not per step
                limit = weights.items_per_actor(written)
                if limit and items_of_version[written] >= limit:
                    if not actor.wait_written(writer, epoch, in_flight=0):
                        break
                    if not weights.wait_next(serial, actor.stop, lambda: actor.check_replay(epoch)):
                        break
                    item_start, item_version = appended, None
                    items_of_version.clear()
                elif credit.available():  # the step just taken starts the next item too
                    credit.take()
                    if not actor.wait_written(writer, epoch):
                        break
                else:  # asynchronous and as far ahead as the policy-lag limit lets it run
                    if not actor.wait_written(writer, epoch, in_flight=0) or not wait_for_credit():
                        break
                    item_start = appended
            obs = next_obs
            discounted_return[done] = 0.0
            actor.count_steps(reward, done)
    finally:
        writer.close()  # no flush: at shutdown the queue may be full and nobody samples it
        # Nothing may keep the client alive (an exception's traceback holds this frame): while it lives, a new
        # client to the same address reuses its connection, which may be the dead one the actor replaces.
        writer = client = None


# Items a DQN writer may have in flight (created, not yet confirmed by the replay server) before the actor waits.
# With 4, an Atari actor (8 envs) spent ~38% of its time in those waits, i.e. on Reverb round trips (py-spy); 32
# gave +25% agent steps/s into Reverb (1,072 and 1,051 -> 1,307 and 1,339, alternating in one run, 2026-11-30).
# The rate limiter still stops an actor within 32 steps of each env.
TRANSITION_ITEMS_IN_FLIGHT = 32


def collect_transitions(actor, venv, weights, epoch: int) -> None:
    """DQN / QDagger: one writer per env; every step, an item of that env's last n+1 steps.

    Each step stores only the newest frame of its observation (S =
    frame_stack frames per observation: 4 for Atari, 1 for vectors); an
    item references the n + S frames its first and bootstrap observations
    need (`rlfleet.replay.server.dqn_signature`). At each episode start the S − 1
    older frames of the first stack are written as padding steps, on which
    no item starts. An episode cut by a time limit (truncated, not
    terminated) gives no items to its last n steps: their n-step targets
    would need the bootstrap observation the reset replaced, and treating
    the cut as terminal would teach that good states end episodes.
    Consecutive items reference the same Reverb chunks, so every frame is
    stored about once. The table's `SampleToInsertRatio` rate limiter
    blocks inserts when actors run ahead of the learner's replay ratio.
    """
    cfg = actor.config
    n, b, stack = cfg.unroll_length, cfg.num_envs, actor.frame_stack
    rng, obs = actor.start_episodes(venv)
    client = reverb.Client(actor.replay_address)
    writers = [client.trajectory_writer(num_keep_alive_refs=n + stack) for _ in range(b)]
    real = [collections.deque(maxlen=n + stack) for _ in range(b)]  # False for padding steps
    zero_action, zero_reward = np.int32(0), np.float32(0.0)

    def append(i: int, step: dict, is_real: bool) -> None:
        """Appends to writer i, then makes the item whose first step is n steps back, if that one is real."""
        writers[i].append(step)
        real[i].append(is_real)
        if len(real[i]) == n + stack and real[i][-(n + 1)]:
            writers[i].create_item(
                cfg.table,
                1.0,
                {
                    k: col[-(n + stack) :] if k == "observation" else col[-(n + 1) :]
                    for k, col in writers[i].history.items()
                },
            )

    def pad(i: int, first_obs: np.ndarray) -> None:
        for k in range(stack - 1):
            append(
                i,
                dict(
                    observation=first_obs[k],
                    action=zero_action,
                    reward=zero_reward,
                    done=False,
                    policy_version=np.int64(-1),
                ),
                False,
            )

    for i in range(b):
        pad(i, obs[i])
    try:
        while not actor.stop.is_set():
            version, arrays, exploration = weights.latest
            actor.policy_version = version
            q = q_values(arrays, obs)
            actor.check_policy_output(version, q)  # NaN Q-values would silently pick action 0
            action = epsilon_greedy_q(q, rng, exploration.epsilon)
            next_obs, reward, terminated, truncated, _ = venv.step(action)
            actor.check_finite(next_obs, reward)
            done = np.logical_or(terminated, truncated)
            frames = np.asarray(obs, np.float32) if stack == 1 else obs[:, -1]  # the newest frame
            for i in range(b):
                append(
                    i,
                    dict(
                        observation=frames[i],
                        action=action[i],
                        reward=np.float32(reward[i]),
                        done=done[i],
                        policy_version=np.int64(version),
                    ),
                    True,
                )
                if truncated[i] and not terminated[i]:
                    # A time limit is not a terminal state, but the observation to bootstrap from is
                    # gone (the env reset): the last n steps, whose n-step windows reach it, get no item.
                    for k in range(1, n + 1):
                        real[i][-k] = False
                if done[i]:  # next_obs[i] starts the next episode
                    pad(i, next_obs[i])
            if not all(actor.wait_written(w, epoch, in_flight=TRANSITION_ITEMS_IN_FLIGHT) for w in writers):
                break
            obs = next_obs
            actor.count_steps(reward, done)
    finally:
        for writer in writers:
            writer.close()  # no flush: at shutdown the rate limiter may block inserts for good
        writers.clear()  # as in collect_trajectories: a new client must not reuse a dead connection
        writer = client = None
