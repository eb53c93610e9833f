"""DQN's replay item, end to end: the table (uniform or prioritized, with a `SampleToInsertRatio` rate limiter),
the item's signature, the actor's behaviour policy and writer (a `rlfleet.actors.adders.WindowAdder`), and the
learner-side decoding of sampled items. QDagger uses the same items.

The table's and the learner's sides (`dqn_signature`, `dqn_tables`, `batches`) import TensorFlow or Reverb's
Python package when called; the actor's side imports neither, so an actor running it never loads TensorFlow's
Python.
"""

from __future__ import annotations

import numpy as np

from rlfleet.actors.adders import NOT_ENDED, TRUNCATED, Act, WindowAdder, window_signature
from rlfleet.algorithms.dqn.policy import epsilon_greedy_q, q_values

TABLE = "dqn_replay"

# The automatic number of envs per item (`envs_per_item` 0) keeps at least this many items in each minibatch.
MIN_ITEMS_PER_BATCH = 4


def envs_per_item(envs_per_actor: int, batch_size: int, setting: int = 0) -> int:
    """How many of an actor's envs share one replay item (G): `setting` when it is not 0, else the largest
    divisor of `envs_per_actor` that is at most batch_size / MIN_ITEMS_PER_BATCH (at least 1).

    Every Reverb item costs the learner and the replay server about the same whatever it holds (a sample
    request, a chunk per field, decompression, a tensor per field), so items of G envs' transitions cost about
    1/G as much per transition to write and to read (docs: Throughput and CPU cost). The transitions of one
    item are the G envs' steps at the same moment: independent episodes of the same behaviour policy.

    Raises:
        ValueError: a `setting` that does not divide `envs_per_actor`.
    """
    if setting:
        if envs_per_actor % setting:
            raise ValueError(
                f"envs_per_item = {setting} does not divide envs_per_actor = {envs_per_actor}: every item holds "
                "the same number of envs. Choose a divisor of envs_per_actor, or 0 to let rlfleet choose."
            )
        return setting
    cap = max(1, batch_size // MIN_ITEMS_PER_BATCH)
    return max(g for g in range(1, envs_per_actor + 1) if envs_per_actor % g == 0 and g <= cap)


def dqn_signature(frame_shape: tuple, obs_dtype, n_step: int, frame_stack: int = 1, envs: int = 1) -> dict:
    """Signature of one DQN item: the last n + S steps of G envs side by side (S = `frame_stack`, G = `envs`).

    Every field has leading shape [n + S, G]: "observation" holds each step's newest frame (the whole
    observation for S = 1); "action", "reward" and "end" the action taken at the step, the reward that followed
    and how the step ended its episode (`NOT_ENDED`, `TERMINATED`, `TRUNCATED`); "policy_version" ([n + S]
    only: one behaviour policy per batch step) the version that acted. Step S − 1 of the item is the transition
    it stands for: its observation is frames [0, S) and its bootstrap observation frames [n, n + S), where the
    frames before an episode's first step are zeros (the zero-padded stack the env gave the policy;
    `transitions` masks them from the `end` field). Consecutive items overlap and reference the same Reverb
    chunks, so each frame is stored about once.
    """
    import tensorflow as tf

    return window_signature(tf.TensorSpec(frame_shape, obs_dtype), envs, n_step + frame_stack)


def items_per_batch(batch_size: int, envs: int) -> int:
    """Items one minibatch of `batch_size` transitions reads from a table of items of `envs` envs each (the
    last item's surplus transitions are dropped)."""
    return -(-batch_size // envs)


def dqn_tables(frame_shape: tuple, obs_dtype, config, frame_stack: int = 1, envs: int = 1) -> list:
    """The DQN replay table of items of `envs` envs each (`dqn_signature`) for frames of `frame_shape` and
    `obs_dtype` stacked `frame_stack` deep, with the replay settings of `config` (a `DQNConfig`: n_step,
    replay_size and min_replay_size in transitions, samples_per_insert, prioritized, priority_exponent,
    batch_size): uniform (or prioritized) sampling, FIFO removal at `replay_size` transitions, and a
    `SampleToInsertRatio` rate limiter holding `samples_per_insert` transitions sampled per transition inserted
    (±10% of `min_replay_size` worth of slack) once `min_replay_size` transitions are in. Sizes and the ratio are
    converted to items here; the ratio counts the surplus transitions a minibatch of `batch_size` reads
    (`items_per_batch`).

    Raises:
        ValueError: non-positive sizes or ratio.
    """
    n_step, replay_size, min_replay_size = config.n_step, config.replay_size, config.min_replay_size
    samples_per_insert, batch_size = config.samples_per_insert, config.batch_size
    if min(n_step, replay_size, min_replay_size, envs) <= 0 or samples_per_insert <= 0:
        raise ValueError("replay: n_step, replay_size, min_replay_size and samples_per_insert must be positive")
    if min_replay_size > replay_size:
        raise ValueError(f"replay: min_replay_size {min_replay_size} exceeds replay_size {replay_size}")
    import reverb

    read = items_per_batch(batch_size, envs) * envs / batch_size if batch_size else 1.0
    ratio = samples_per_insert * read
    min_items = -(-min_replay_size // envs)
    error_buffer = max(1.0, ratio, 0.1 * ratio * min_items)
    uniform = reverb.selectors.Uniform()
    sampler = reverb.selectors.Prioritized(config.priority_exponent) if config.prioritized else uniform
    return [
        reverb.Table(
            name=TABLE,
            sampler=sampler,
            remover=reverb.selectors.Fifo(),
            max_size=-(-replay_size // envs),
            rate_limiter=reverb.rate_limiters.SampleToInsertRatio(ratio, min_items, error_buffer),
            signature=dqn_signature(frame_shape, obs_dtype, n_step, frame_stack, envs),
        )
    ]


def dqn_tables_for(spec, config, queue_items: int | None = None) -> list:
    """DQN's (and QDagger's) table for an env spec and a `DQNConfig` (`queue_items` does not apply)."""
    envs = envs_per_item(config.envs_per_actor, config.batch_size, config.envs_per_item)
    return dqn_tables(spec.frame_shape, np.dtype(spec.obs_dtype), config, spec.frame_stack, envs)


# Items a DQN writer may have in flight (created, not yet confirmed by the replay server) before the actor waits:
# enough that an Atari actor does not spend its time waiting on Reverb round trips (the docs' Atari benchmark
# page); the rate limiter still stops an actor within this many batch steps.
TRANSITION_ITEMS_IN_FLIGHT = 32


GUIDE_PREFIX = "guide/"  # weights of a JSRL guide's Q-network, beside the student's (`QDaggerAgent.export_weights`)


def behaviour(actor):
    """DQN's (and QDagger's) behaviour policy for `rlfleet.actors.adders.collect`: ε-greedy on the Q-values of
    the latest weights, ε from their `Exploration` message. When that message sets `guide_roll_in_steps` H > 0
    (JSRL, Uchendu et al. 2023), the guide's Q-network (the weights under `GUIDE_PREFIX`) acts greedily for the
    first h steps of each episode, h drawn uniformly from 1..H when the episode begins (reincarnating_rl's
    JSRLAgent: `num_roll_in_steps`), and the student ε-greedily from then on."""
    roll_in = np.zeros(actor.config.num_envs, np.int64)  # h of each env's current episode
    guide: dict = {"arrays": None, "of": None}  # the guide's weights, taken out of each version's arrays once

    def act(policy, obs, rng) -> Act:
        q = q_values(policy.arrays, obs)
        actor.check_policy_output(policy.version, q)  # NaN Q-values would silently pick action 0
        action = epsilon_greedy_q(q, rng, policy.exploration.epsilon)
        bound = policy.exploration.guide_roll_in_steps
        if bound > 0:
            steps = actor.episode_steps
            starting = steps == 0
            roll_in[starting] = rng.integers(1, bound + 1, int(starting.sum()))
            guided = np.flatnonzero(steps < roll_in)
            if len(guided):
                if guide["of"] is not policy.arrays:
                    arrays = policy.arrays.items()
                    guide["arrays"] = {k[len(GUIDE_PREFIX) :]: v for k, v in arrays if k.startswith(GUIDE_PREFIX)}
                    guide["of"] = policy.arrays
                # The whole batch (one shape: a compiled CNN is not traced again for each count of guided envs).
                guide_q = q_values(guide["arrays"], obs)
                actor.check_policy_output(policy.version, guide_q)
                action[guided] = guide_q[guided].argmax(-1)
        return Act(action, action, {})

    return act


def adder(actor, weights, epoch: int) -> WindowAdder:
    """DQN's replay writer: after every batch step, one item per group of `envs_per_item` envs of the last
    n + S steps (n = the run's `n_step`, sent as its unroll length; S = the frame stack), so that each item
    stands for the transition at its step S − 1 (`WindowAdder`, decoded by `transitions`). The episodes' ends
    are kept apart (terminated or cut by a time limit: a time limit is not a terminal state); the table's
    `SampleToInsertRatio` rate limiter blocks inserts when actors run ahead of the learner's replay ratio."""
    span = actor.config.unroll_length + actor.frame_stack
    return WindowAdder(actor, epoch, span, actor.frame_stack, in_flight=TRANSITION_ITEMS_IN_FLIGHT)


def _stack(frames, end, first: int, frame_stack: int):
    """The stacked observations [N, S, *frame] of window steps first .. first + S − 1 of `frames` [N, W, *frame],
    with the frames before the newest frame's episode began set to zero (`end` [N, W] int: a step that ended an
    episode makes every frame up to it belong to an earlier one)."""
    import tensorflow as tf

    window = frames[:, first : first + frame_stack]
    ended = tf.cast(end[:, first : first + frame_stack - 1] != NOT_ENDED, tf.int32)  # [N, S − 1]
    later_ends = tf.cumsum(ended, axis=1, reverse=True)  # episode ends from frame j to the newest one
    keep = tf.concat([tf.equal(later_ends, 0), tf.ones_like(later_ends[:, :1], tf.bool)], axis=1)
    keep = tf.reshape(keep, tf.concat([tf.shape(keep), tf.ones([tf.rank(window) - 2], tf.int32)], 0))
    return tf.where(keep, window, tf.zeros_like(window))


def transitions(data: dict, n_step: int, frame_stack: int, batch_size: int | None = None) -> dict:
    """The n-step transitions of a batch of sampled items, as the learner trains on them (pure TensorFlow).

    Args:
        data: a batch of K items of the table's signature: either `dqn_signature`'s (fields [K, n + S, G, ...],
            "policy_version" [K, n + S]) or the single-env layout of rlfleet before items held several envs
            ("observation" [K, n + S, ...], "action", "reward", "done", "policy_version" [K, n + 1], with the
            older frames of each episode's first stack written as steps, and items only for usable
            transitions), which teachers' replays from that time hold.
        n_step: n; frame_stack: S.
        batch_size: keep the first this many transitions (None: all K·G).
    Returns:
        {"observation": [N, *obs_shape] (N = K·G or batch_size; obs_shape = [S, *frame] for S > 1),
         "next_observation": the bootstrap observation n steps later, like "observation",
         "action": int32 [N], "reward": float32 [N, n], "done": float32 [N, n] (1 where the episode ended
         after step k), "valid": float32 [N] (0 for a transition whose n-step window reaches a time-limit cut:
         it has no bootstrap observation and must not be trained on), "policy_version": int64 [N]}.
    """
    layout = _grouped_transitions if "end" in data else _single_env_transitions
    out = layout(data, n_step, frame_stack)
    if batch_size is not None:
        out = {k: v[:batch_size] for k, v in out.items()}
    return out


def _single_env_transitions(data: dict, n: int, s: int) -> dict:
    """`transitions` of items in the single-env layout (every item a usable transition)."""
    import tensorflow as tf

    first, bootstrap = split_observations(data["observation"], n, s)
    rows = tf.shape(data["action"])[0]
    return dict(
        observation=first,
        next_observation=bootstrap,
        action=tf.cast(data["action"][:, 0], tf.int32),
        reward=tf.cast(data["reward"][:, :n], tf.float32),
        done=tf.cast(data["done"][:, :n], tf.float32),
        valid=tf.ones([rows], tf.float32),
        policy_version=tf.cast(data["policy_version"][:, 0], tf.int64),
    )


def _grouped_transitions(data: dict, n: int, s: int) -> dict:
    """`transitions` of items of `dqn_signature` (G envs each, S − 1 leading steps for the first stack)."""
    import tensorflow as tf

    envs = tf.shape(data["action"])[2]

    def per_env(x):  # [K, W, G, ...] -> [K·G, W, ...]
        x = tf.transpose(x, tf.concat([[0, 2, 1], tf.range(3, tf.rank(x))], 0))
        return tf.reshape(x, tf.concat([[-1], tf.shape(x)[2:]], 0))

    frames, end = per_env(data["observation"]), per_env(data["end"])
    window_end = end[:, s - 1 : s - 1 + n]
    done = tf.cast(window_end != NOT_ENDED, tf.float32)
    before_first_end = tf.math.cumprod(1.0 - done, axis=1, exclusive=True)
    cut = tf.reduce_sum(before_first_end * tf.cast(window_end == TRUNCATED, tf.float32), axis=1)
    if s == 1:
        first, bootstrap = frames[:, 0], frames[:, n]
    else:
        first, bootstrap = _stack(frames, end, 0, s), _stack(frames, end, n, s)
    return dict(
        observation=first,
        next_observation=bootstrap,
        action=per_env(data["action"])[:, s - 1],
        reward=per_env(data["reward"])[:, s - 1 : s - 1 + n],
        done=done,
        valid=1.0 - tf.minimum(cut, 1.0),
        policy_version=tf.repeat(data["policy_version"][:, s - 1], envs),
    )


def split_observations(frames, n_step: int, frame_stack: int):
    """The first and bootstrap observations of single-env items whose frames need no masking.

    Args:
        frames: [N, n + S, *frame_shape] item frames.
    Returns:
        (obs_t, obs_{t+n}): [N, *frame_shape] each for S = 1, else [N, S, *frame_shape].
    """
    if frame_stack == 1:
        return frames[:, 0], frames[:, n_step]
    return frames[:, :frame_stack], frames[:, n_step : n_step + frame_stack]


def sample_info(info, envs: int, batch_size: int) -> dict:
    """What prioritized replay needs of K sampled items (Reverb's `SampleInfo`, fields [K]) of `envs` envs each,
    whose first `batch_size` transitions a minibatch holds: {"item": int32 [batch_size], the item each
    transition came from (0..K-1); "key": uint64 [K], the items' keys; "probability": float64 [K], the
    probability each was sampled with; "table_size": int64 [K], the items in the table then}."""
    import tensorflow as tf

    return dict(
        item=tf.range(batch_size, dtype=tf.int32) // envs,
        key=info.key,
        probability=info.probability,
        table_size=info.table_size,
    )


def table_envs(signature: dict) -> int | None:
    """G, the envs per item of a table with `signature` (1 for the single-env layout); None for a signature
    that is neither DQN layout."""
    if {"observation", "action", "reward", "policy_version"} - set(signature):
        return None
    if "end" in signature and signature["action"].shape.rank == 2:
        return int(signature["action"].shape[1])
    if "done" in signature and signature["action"].shape.rank == 1:
        return 1
    return None


def batches(
    replay_address: str,
    batch_size: int,
    n_step: int,
    frame_stack: int,
    minibatches: int = 1,
    table: str = TABLE,
    rate_limiter_timeout_ms: int = 1000,
    with_info: bool = False,
):
    """Yields `minibatches` minibatches of `batch_size` transitions at a time (`transitions`' fields with a
    leading [minibatches] axis: [minibatches, batch_size, ...]) drawn from `table`, forever. With `with_info`
    (prioritized replay), each minibatch also holds what `sample_info` adds.

    Reverb's tf.data dataset (`TrajectoryDataset`, its documented path for training) reads the items, K per
    minibatch (`items_per_batch`: G envs' transitions each, G read from the table's signature, so a teacher's
    replay of another layout reads too), and turns them into transitions inside the dataset's graph; the next
    yield is prefetched while this one trains. A dataset whose sample requests wait on the rate limiter for
    longer than `rate_limiter_timeout_ms` ends (Reverb's semantics) and is opened again, so no request stays
    blocked for long: a learner whose actors have stopped still exits promptly (an indefinitely blocked request
    held the process for minutes at exit); the minibatches it had begun are dropped.
    """
    import reverb

    while True:
        dataset = reverb.TrajectoryDataset.from_table_signature(
            server_address=replay_address,
            table=table,
            max_in_flight_samples_per_worker=2 * batch_size,
            rate_limiter_timeout_ms=rate_limiter_timeout_ms,
        )
        envs = table_envs(dataset.element_spec.data) or 1
        k = items_per_batch(batch_size, envs)

        def decode(sample, envs=envs):
            out = transitions(sample.data, n_step, frame_stack, batch_size)
            return dict(out, **sample_info(sample.info, envs, batch_size)) if with_info else out

        dataset = dataset.batch(k, drop_remainder=True).map(decode)
        yield from dataset.batch(minibatches, drop_remainder=True).prefetch(1)
