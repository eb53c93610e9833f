"""BatchPPO's replay item, end to end: the table (a FIFO queue), the item's signature, and the actor's behaviour
policy and writer (a `rlfleet.actors.adders.SequenceAdder`).

One FIFO queue table (`reverb.Table.queue`): every item is sampled exactly once, and its `Queue` rate limiter
blocks actors' inserts while the table is full, so actors can run at most `queue_items` items ahead of the
learner. The table signature makes Reverb reject items of the wrong shape or dtype at insert. The learner reads
the items back in `rlfleet.algorithms.ppo.agent.PPOAgent`.

The table's side (`ppo_signature`, `ppo_tables`) imports TensorFlow and Reverb's Python package when called; the
actor's side imports neither, so an actor running it never loads TensorFlow's Python.
"""

from __future__ import annotations

import numpy as np

from rlfleet.actors.adders import Act, SequenceAdder, sequence_signature
from rlfleet.algorithms.ppo.policy import sample_actions, to_env_action

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

    vector = tf.TensorSpec([obs_dim], tf.float32)
    act = tf.TensorSpec([action_dim], tf.float32)
    scalar = tf.TensorSpec([], tf.float32)
    extras = dict(behaviour_log_prob=scalar, behaviour_mean=act, behaviour_log_std=act)
    options = dict(final_observation=True, discounted_return=True)
    return sequence_signature(vector, act, num_envs, unroll_length + 1, extras, **options)


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


def behaviour(actor):
    """BatchPPO's behaviour policy for `rlfleet.actors.adders.collect`: a Gaussian sample per env
    (`sample_actions`), clipped to the action space for the env; the items record the unclipped sample with the
    behaviour distribution (log-prob, mean, log-std) that the learner's importance ratios and KL need."""
    low = np.asarray(actor.net.action_low, np.float32)
    high = np.asarray(actor.net.action_high, np.float32)

    def act(policy, obs, rng) -> Act:
        action, log_prob, mean, log_std = sample_actions(policy.arrays, obs, rng)
        actor.check_policy_output(policy.version, action, log_prob)
        extras = dict(behaviour_log_prob=log_prob, behaviour_mean=mean, behaviour_log_std=log_std)
        return Act(to_env_action(action, low, high), action, extras)

    return act


def adder(actor, weights, epoch: int) -> SequenceAdder:
    """BatchPPO's replay writer: items of T+1 batch steps (`SequenceAdder`), with the episodes' true last
    observations at time limits (the learner bootstraps from them) and their discounted returns so far."""
    return SequenceAdder(actor, weights, epoch, final_observation=True, discounted_return=actor.net.discount)
