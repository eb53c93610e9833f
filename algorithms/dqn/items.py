"""DQN's replay item, end to end: the table (uniform or prioritized, with a `SampleToInsertRatio` rate limiter),
the item's signature, the actor-side writer that makes items, and the learner-side decoding of sampled items.
QDagger uses the same items.

The table's and the learner's sides (`dqn_signature`, `dqn_tables`, `batches`) import TensorFlow or Reverb's
Python package when called; the writer's side imports neither (it writes through
`rlfleet.actors.replay_client`), so an actor running it never loads TensorFlow's Python.
"""

from __future__ import annotations

import collections

import numpy as np

from rlfleet.actors.replay_client import Client
from rlfleet.algorithms.dqn.policy import epsilon_greedy_q, q_values

TABLE = "dqn_replay"


def dqn_signature(frame_shape: tuple, obs_dtype, n_step: int, frame_stack: int = 1) -> dict:
    """Signature of one DQN item: n+1 consecutive steps of one env, plus the frames their stacks need.

    "observation" holds the newest frame of each of the last n + S steps
    (S = `frame_stack`): the observation of the item's first step t is frames
    [0, S) and the bootstrap observation of step t+n is frames [n, n+S). The
    other fields have leading shape [n+1]: step k holds the action taken, the
    reward and `done` (episode ended after step k) that followed, and the
    behaviour policy version. Consecutive items overlap and reference the same
    Reverb chunks, so each frame is stored about once (not S times, as stacked
    observations per transition would be). For S > 1 the actor writes the
    S − 1 older frames of each episode's first stack as padding steps (action
    0, reward 0, not done, version −1) that no item starts on.
    """
    import tensorflow as tf

    lead = [n_step + 1]
    return {
        "observation": tf.TensorSpec([n_step + frame_stack] + list(frame_shape), obs_dtype),
        "action": tf.TensorSpec(lead, tf.int32),
        "reward": tf.TensorSpec(lead, tf.float32),
        "done": tf.TensorSpec(lead, tf.bool),
        "policy_version": tf.TensorSpec(lead, tf.int64),
    }


def dqn_tables(
    frame_shape: tuple,
    obs_dtype,
    n_step: int,
    replay_size: int,
    min_replay_size: int,
    samples_per_insert: float,
    prioritized: bool = False,
    priority_exponent: float = 0.6,
    frame_stack: int = 1,
) -> list:
    """The DQN replay table: uniform (or prioritized) sampling, FIFO removal at `replay_size` items,
    and a `SampleToInsertRatio` rate limiter holding `samples_per_insert` (±10% of
    `min_replay_size` worth of slack) once `min_replay_size` items are in.

    Raises:
        ValueError: non-positive sizes or ratio.
    """
    if min(n_step, replay_size, min_replay_size) <= 0 or samples_per_insert <= 0:
        raise ValueError("replay: n_step, replay_size, min_replay_size and samples_per_insert must be positive")
    if min_replay_size > replay_size:
        raise ValueError(f"replay: min_replay_size {min_replay_size} exceeds replay_size {replay_size}")
    import reverb

    error_buffer = max(1.0, samples_per_insert, 0.1 * samples_per_insert * min_replay_size)
    sampler = reverb.selectors.Prioritized(priority_exponent) if prioritized else reverb.selectors.Uniform()
    return [
        reverb.Table(
            name=TABLE,
            sampler=sampler,
            remover=reverb.selectors.Fifo(),
            max_size=replay_size,
            rate_limiter=reverb.rate_limiters.SampleToInsertRatio(samples_per_insert, min_replay_size, error_buffer),
            signature=dqn_signature(frame_shape, obs_dtype, n_step, frame_stack),
        )
    ]


def dqn_tables_for(spec, config, queue_items: int | None = None) -> list:
    """DQN's (and QDagger's) table for an env spec and a `DQNConfig` (`queue_items` does not apply)."""
    return dqn_tables(
        spec.frame_shape,
        np.dtype(spec.obs_dtype),
        config.n_step,
        config.replay_size,
        config.min_replay_size,
        config.samples_per_insert,
        config.prioritized,
        config.priority_exponent,
        spec.frame_stack,
    )


# Items a DQN writer may have in flight (created, not yet confirmed by the replay server) before the actor waits:
# enough that an Atari actor does not spend its time waiting on Reverb round trips (the docs' Atari benchmark
# page); the rate limiter still stops an actor within this many steps of each env.
TRANSITION_ITEMS_IN_FLIGHT = 32


def collect_transitions(actor, venv, weights, epoch: int) -> None:
    """DQN / QDagger: one writer per env; every step, an item of that env's last n+1 steps.

    Each step stores only the newest frame of its observation (S =
    frame_stack frames per observation: 4 for Atari, 1 for vectors); an
    item references the n + S frames its first and bootstrap observations
    need (`dqn_signature`). At each episode start the S − 1
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
    client = Client(actor.replay_address)
    envs = [_EnvWriter(client, cfg.table, n, stack) for _ in range(b)]
    for i in range(b):
        envs[i].pad(obs[i])
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
            for i, env in enumerate(envs):
                step = dict(
                    observation=frames[i],
                    action=action[i],
                    reward=np.float32(reward[i]),
                    done=done[i],
                    policy_version=np.int64(version),
                )
                env.append(step, True)
                if truncated[i] and not terminated[i]:
                    env.cut_by_time_limit()
                if done[i]:  # next_obs[i] starts the next episode
                    env.pad(next_obs[i])
            if not all(actor.wait_written(e.writer, epoch, in_flight=TRANSITION_ITEMS_IN_FLIGHT) for e in envs):
                break
            obs = next_obs
            actor.count_steps(reward, done)
    finally:
        for env in envs:
            env.writer.close()  # no flush: at shutdown the rate limiter may block inserts for good
        envs.clear()  # as in collect_trajectories: a new client must not reuse a dead connection
        env = client = None


class _EnvWriter:
    """One env's Reverb writer in `collect_transitions`, and which of its last n + S steps are real (padding
    steps, on which no item starts, are not)."""

    def __init__(self, client, table: str, n: int, stack: int):
        self.table, self.n, self.stack = table, n, stack
        self.writer = client.trajectory_writer(num_keep_alive_refs=n + stack)
        self.real = collections.deque(maxlen=n + stack)

    def append(self, step: dict, is_real: bool) -> None:
        """Appends `step`, then makes the item whose first step is n steps back, if that one is real."""
        n, stack = self.n, self.stack
        self.writer.append(step)
        self.real.append(is_real)
        if len(self.real) == n + stack and self.real[-(n + 1)]:
            history = self.writer.history
            columns = {k: col[-(n + stack) :] if k == "observation" else col[-(n + 1) :] for k, col in history.items()}
            self.writer.create_item(self.table, 1.0, columns)

    def pad(self, first_obs: np.ndarray) -> None:
        """The S − 1 older frames of an episode's first observation stack, as padding steps."""
        for k in range(self.stack - 1):
            step = dict(
                observation=first_obs[k],
                action=np.int32(0),
                reward=np.float32(0.0),
                done=False,
                policy_version=np.int64(-1),
            )
            self.append(step, False)

    def cut_by_time_limit(self) -> None:
        """A time limit is not a terminal state, but the observation to bootstrap from is gone (the env reset):
        the last n steps, whose n-step windows reach it, get no item."""
        for k in range(1, self.n + 1):
            self.real[-k] = False


def split_observations(frames, n_step: int, frame_stack: int):
    """The first and bootstrap observations of DQN items (see `dqn_signature`).

    Args:
        frames: [N, n + S, *frame_shape] item frames.
    Returns:
        (obs_t, obs_{t+n}): [N, *frame_shape] each for S = 1, else [N, S, *frame_shape].
    """
    if frame_stack == 1:
        return frames[:, 0], frames[:, n_step]
    return frames[:, :frame_stack], frames[:, n_step : n_step + frame_stack]


def batches(replay_address: str, batch_size: int, table: str = TABLE, rate_limiter_timeout_ms: int = 1000):
    """Yields minibatches {field: [batch_size, ...]} drawn from `table` through Reverb's tf.data dataset, forever.

    A dataset whose sample requests wait on the rate limiter for longer than
    `rate_limiter_timeout_ms` ends (Reverb's semantics) and is opened again, so
    no request stays blocked for long: a learner whose actors have stopped
    still exits promptly (an indefinitely blocked request held the process
    for minutes at exit).
    """
    import reverb

    while True:
        dataset = reverb.TrajectoryDataset.from_table_signature(
            server_address=replay_address,
            table=table,
            max_in_flight_samples_per_worker=2 * batch_size,
            rate_limiter_timeout_ms=rate_limiter_timeout_ms,
        )
        for sample in dataset.batch(batch_size, drop_remainder=True):
            yield sample.data
