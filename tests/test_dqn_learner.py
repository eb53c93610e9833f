"""DQN agent without any server: update, target network, exported weights, replay table."""

import numpy as np
import pytest
import reverb
import tensorflow as tf

from rlfleet.algorithms import require_action_kind
from rlfleet.algorithms.dqn.agent import DQNAgent
from rlfleet.algorithms.dqn.items import TABLE as DQN_TABLE
from rlfleet.algorithms.dqn.policy import epsilon_greedy
from rlfleet.algorithms.library.policy import mlp_forward
from rlfleet.algorithms.settings import make_algo_config
from rlfleet.envs.core import EnvError, env_spec
from rlfleet.replay.server import tables_for

SPEC = env_spec("CartPole-v1")


def make_batch(cfg, rng, size=None, minibatches=None):
    """Random CartPole-shaped transitions as the learner's input path gives them: `minibatches` minibatches
    ([K, N, ...] fields, what `consume` takes) or with None one ([N, ...], what `_train_step` takes), about a
    tenth of them without a bootstrap observation."""
    if minibatches is not None:
        parts = [make_batch(cfg, rng, size) for _ in range(minibatches)]
        return {k: tf.stack([p[k] for p in parts]) for k in parts[0]}
    size, n = size or cfg.batch_size, cfg.n_step
    return dict(
        observation=tf.constant(rng.standard_normal((size, 4)), tf.float32),
        next_observation=tf.constant(rng.standard_normal((size, 4)), tf.float32),
        action=tf.constant(rng.integers(0, 2, size), tf.int32),
        reward=tf.constant(rng.standard_normal((size, n)), tf.float32),
        done=tf.constant(rng.random((size, n)) < 0.1, tf.float32),
        valid=tf.constant(rng.random(size) > 0.1, tf.float32),
        policy_version=tf.zeros(size, tf.int64),
    )


def test_fitting_a_fixed_batch_lowers_the_td_loss_and_target_syncs():
    cfg = make_algo_config("dqn", "default", "CartPole-v1", {"target_update_period": 10**9, "publish_every": 5})
    agent = DQNAgent(SPEC, cfg, seed=0)
    batch = make_batch(cfg, np.random.default_rng(0))
    first = agent._train_step(batch)[0].numpy()
    for _ in range(200):
        loss = agent._train_step(batch)[0].numpy()
    assert loss < 0.5 * first
    # The target network has not moved (period not reached) until it is copied.
    x = tf.constant(np.ones((1, 4), np.float32))
    assert not np.allclose(agent.q(x), agent.target_q(x))
    agent._copy_target()
    np.testing.assert_allclose(agent.q(x), agent.target_q(x))


def test_transitions_left_out_of_the_loss_do_not_move_the_network():
    cfg = make_algo_config("dqn", "default", "CartPole-v1")
    agent = DQNAgent(SPEC, cfg, seed=0)
    batch = make_batch(cfg, np.random.default_rng(0))
    before = [v.numpy() for v in agent.q.trainable_variables]
    loss = agent._train_step(dict(batch, valid=tf.zeros_like(batch["valid"])))[0]
    assert loss.numpy() == 0.0
    for b, v in zip(before, agent.q.trainable_variables):
        np.testing.assert_array_equal(b, v.numpy())
    # Only the valid transitions count: the loss equals the loss of the valid rows alone.
    keep = batch["valid"].numpy() > 0
    alone = {k: tf.boolean_mask(v, keep) for k, v in batch.items()}
    np.testing.assert_allclose(agent._td_loss(batch)[0].numpy(), agent._td_loss(alone)[0].numpy(), rtol=1e-5)


def test_consume_publishes_every_n_steps_with_decayed_epsilon():
    cfg = make_algo_config("dqn", "default", "CartPole-v1", {"publish_every": 3})
    agent = DQNAgent(SPEC, cfg, seed=0)
    rng = np.random.default_rng(1)
    half = cfg.epsilon_decay_env_steps // 2
    results = [agent.consume(make_batch(cfg, rng, minibatches=1), 0, env_steps=half) for _ in range(6)]
    assert [r.updated for r in results] == [False, False, True, False, False, True]
    assert all(r.gradient_steps == 1 for r in results)
    # Two minibatches per call: published whenever the learner steps pass a multiple of 3 (steps 8, 10, 12).
    results = [agent.consume(make_batch(cfg, rng, minibatches=2), 0, env_steps=half) for _ in range(3)]
    assert [r.updated for r in results] == [False, True, True] and int(agent.learner_steps.numpy()) == 12
    expected = cfg.epsilon_start + 0.5 * (cfg.epsilon_end - cfg.epsilon_start)
    assert agent.exploration()["epsilon"] == pytest.approx(expected, rel=1e-5)


def test_several_gradient_steps_in_one_call_are_the_same_steps_one_by_one():
    """`_train_steps` on K stacked minibatches trains exactly as K single steps do, the target network copied at
    the same learner steps in between."""
    cfg = make_algo_config("dqn", "default", "CartPole-v1", {"target_update_period": 3})
    minibatches = make_batch(cfg, np.random.default_rng(0), minibatches=5)
    together, apart = DQNAgent(SPEC, cfg, seed=0), DQNAgent(SPEC, cfg, seed=0)
    together._train_steps(minibatches)
    for i in range(5):
        apart._train_step({k: v[i] for k, v in minibatches.items()})
        apart.learner_steps.assign_add(1)
        if int(apart.learner_steps.numpy()) % cfg.target_update_period == 0:
            apart._copy_target()
    assert int(together.learner_steps.numpy()) == 5
    for a, b in zip(together.q.variables + together.target_q.variables, apart.q.variables + apart.target_q.variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)
    # The target network was copied at step 3 and has not moved since: it differs from the online network.
    x = tf.constant(np.ones((1, 4), np.float32))
    assert not np.allclose(together.q(x), together.target_q(x))


def test_resumed_agent_publishes_the_scheduled_epsilon():
    cfg = make_algo_config("dqn", "default", "CartPole-v1")
    agent = DQNAgent(SPEC, cfg, seed=0)
    assert agent.exploration()["epsilon"] == pytest.approx(cfg.epsilon_start)
    agent.on_resume(env_steps=10 * cfg.epsilon_decay_env_steps)  # a run restored long after the decay
    assert agent.exploration()["epsilon"] == pytest.approx(cfg.epsilon_end)


def test_numpy_actor_q_matches_tensorflow_and_epsilon_greedy():
    cfg = make_algo_config("dqn", "default", "CartPole-v1")
    agent = DQNAgent(SPEC, cfg, seed=3)
    arrays = agent.export_weights()
    obs = np.random.default_rng(0).standard_normal((64, 4)).astype(np.float32)
    np.testing.assert_allclose(mlp_forward(arrays, obs, "q"), agent.q(obs).numpy(), atol=1e-5)
    rng = np.random.default_rng(0)
    greedy = epsilon_greedy(arrays, obs, rng, epsilon=0.0)
    assert np.array_equal(greedy, agent.q(obs).numpy().argmax(-1))
    random_actions = epsilon_greedy(arrays, np.repeat(obs[:1], 2000, 0), rng, epsilon=1.0)
    assert 0.4 < random_actions.mean() < 0.6


def test_replay_table_rate_limiter_and_signature():
    cfg = make_algo_config("dqn", "default", "CartPole-v1")
    [table] = tables_for("dqn", SPEC, cfg)
    server = reverb.Server([table])
    try:
        info = reverb.Client(f"localhost:{server.port}").server_info()[DQN_TABLE]
        envs = cfg.envs_per_actor  # CartPole: 4 envs per actor, batch 64: one item per batch step of 4 envs
        assert info.max_size == cfg.replay_size // envs
        assert info.rate_limiter_info.samples_per_insert == cfg.samples_per_insert
        assert info.rate_limiter_info.min_size_to_sample == cfg.min_replay_size // envs
        assert info.signature["observation"].shape == (cfg.n_step + 1, envs, 4)
    finally:
        server.stop()


def test_action_space_must_match_the_algorithm():
    with pytest.raises(EnvError, match="needs discrete actions"):
        require_action_kind(env_spec("HalfCheetah-v5"), "dqn")
    with pytest.raises(ValueError, match="unknown DQN setting"):
        make_algo_config("dqn", "default", "CartPole-v1", {"lr": 1})


def test_prioritized_replay_weights_the_loss_and_sets_each_sampled_items_priority_from_its_td_errors():
    """Prioritized replay end to end on a real Reverb server: the learner reads the items' sample info, weights
    its TD loss by their importance weights, and sets each sampled item's priority to its largest |TD error| (+ε),
    which the table then samples by."""
    # 100 items of 4 envs fill the table to its minimum; the rate limiter's slack admits a few more unsampled.
    overrides = dict(prioritized=True, min_replay_size=400, samples_per_insert=1000.0, gradient_steps_per_call=2)
    cfg = make_algo_config("dqn", "default", "CartPole-v1", overrides)
    [table] = tables_for("dqn", SPEC, cfg)
    server = reverb.Server([table])
    try:
        address = f"localhost:{server.port}"
        client = reverb.Client(address)
        envs, span = cfg.envs_per_actor, cfg.n_step + 1
        rng = np.random.default_rng(0)
        with client.trajectory_writer(num_keep_alive_refs=span) as writer:
            for t in range(104 + span - 1):
                writer.append(
                    dict(
                        observation=rng.standard_normal((envs, 4)).astype(np.float32),
                        action=rng.integers(0, 2, envs).astype(np.int32),
                        reward=rng.standard_normal(envs).astype(np.float32),
                        end=np.zeros(envs, np.int8),
                        policy_version=np.int64(0),
                    )
                )
                if t + 1 >= span:
                    writer.create_item(DQN_TABLE, 1.0, {k: col[-span:] for k, col in writer.history.items()})
            writer.flush()
        agent = DQNAgent(SPEC, cfg, seed=0)
        batch = next(agent.samples(address))
        assert {"key", "probability", "table_size", "item"} <= set(batch)
        k_items = batch["key"].shape[1]
        # The loss a minibatch trains on is the importance-weighted one (all weights 1 while every priority is 1).
        first = {f: v[0] for f, v in batch.items()}
        _, _, _, priorities = agent._td_loss(first)
        assert priorities.shape == (k_items,)
        agent.consume(batch, policy_version=0, env_steps=0)
        sampled = {}
        for sample in client.sample(DQN_TABLE, num_samples=2000):  # a list: each step of the item
            sampled[int(sample[0].info.key)] = float(sample[0].info.priority)
        keys = batch["key"].numpy().ravel().tolist()
        changed = [sampled[key] for key in keys if key in sampled]
        # Stored as ratios to the largest priority set so far: the largest is 1 (where new items go in), the
        # others below it.
        assert changed and all(0 < p <= 1.0 for p in changed) and max(changed) == 1.0, changed
        assert min(changed) < 1.0 and len(set(changed)) > 1, changed
        untouched = [p for key, p in sampled.items() if key not in keys]
        assert untouched and all(p == 1.0 for p in untouched)
    finally:
        server.stop()
