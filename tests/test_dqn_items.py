"""DQN's replay items without a server: how many envs an item holds, the learner's decoding of items of G envs
into transitions (time-limit cuts left out, stacks zeroed before an episode's first frame) and of the
single-env layout of teachers' replays written before, and which tables a run and a teacher may have."""

import numpy as np
import pytest
import tensorflow as tf

from rlfleet.actors.adders import NOT_ENDED, TERMINATED, TRUNCATED
from rlfleet.algorithms.dqn.agent import DQNAgent
from rlfleet.algorithms.dqn.items import (
    dqn_signature,
    envs_per_item,
    items_per_batch,
    transitions,
)
from rlfleet.algorithms.settings import make_algo_config
from rlfleet.envs.core import env_spec


def test_envs_per_item_keeps_four_moments_per_minibatch():
    assert envs_per_item(4, 64) == 4  # CartPole's preset: 16 items of 4 envs per minibatch
    assert envs_per_item(8, 32) == 8  # Atari's: 4 items of 8
    assert envs_per_item(16, 32) == 8  # at most batch_size / 4
    assert envs_per_item(7, 32) == 7 and envs_per_item(7, 16) == 1  # a divisor of envs_per_actor
    assert envs_per_item(1, 64) == 1 and envs_per_item(12, 2) == 1
    assert envs_per_item(8, 32, setting=2) == 2
    with pytest.raises(ValueError, match="does not divide envs_per_actor"):
        envs_per_item(8, 32, setting=3)
    with pytest.raises(ValueError, match="envs_per_item = 3 does not divide envs_per_actor = 8"):
        make_algo_config("dqn", "default", "CartPole-v1", {"envs_per_actor": 8, "envs_per_item": 3})
    assert items_per_batch(64, 4) == 16 and items_per_batch(32, 6) == 6


def _items(end, frames, n, stack):
    """One batch of K items of G envs from `end` [K, W, G] and frames [K, W, G, *frame] (W = n + S)."""
    k, w, g = end.shape
    return dict(
        observation=tf.constant(frames),
        action=tf.constant(np.arange(k * w * g).reshape(k, w, g), tf.int32),
        reward=tf.constant(np.arange(k * w * g).reshape(k, w, g), tf.float32),
        end=tf.constant(end, tf.int8),
        policy_version=tf.constant(np.arange(k * w).reshape(k, w), tf.int64),
    )


def test_items_of_several_envs_become_one_transition_per_env():
    n, stack, g = 3, 1, 2
    end = np.zeros((1, n + 1, g), np.int8)
    end[0, 1, 0] = TRUNCATED  # env 0: a time limit cut inside the window, no bootstrap observation
    end[0, 2, 1] = TERMINATED  # env 1: a terminal state inside the window
    frames = np.arange(1 * (n + 1) * g * 4, dtype=np.float32).reshape(1, n + 1, g, 4)
    data = _items(end, frames, n, stack)
    t = {k: v.numpy() for k, v in transitions(data, n, stack).items()}
    np.testing.assert_array_equal(t["observation"], frames[0, 0])  # env 0 first, then env 1
    np.testing.assert_array_equal(t["next_observation"], frames[0, n])
    np.testing.assert_array_equal(t["action"], data["action"].numpy()[0, 0])
    np.testing.assert_array_equal(t["reward"], data["reward"].numpy()[0, :n].T)
    np.testing.assert_array_equal(t["done"], [[0, 1, 0], [0, 0, 1]])
    np.testing.assert_array_equal(t["valid"], [0.0, 1.0])
    np.testing.assert_array_equal(t["policy_version"], [0, 0])
    assert transitions(data, n, stack, batch_size=1)["action"].shape == (1,)


def test_a_cut_after_a_terminal_state_does_not_matter():
    n, stack = 3, 1
    end = np.zeros((1, n + 1, 1), np.int8)
    end[0, 0, 0], end[0, 1, 0] = TERMINATED, TRUNCATED  # (a padding step cannot follow, but the rule holds)
    t = transitions(_items(end, np.zeros((1, n + 1, 1, 4), np.float32), n, stack), n, stack)
    assert t["valid"].numpy().tolist() == [1.0]


def test_stacks_are_zero_before_the_episode_began():
    n, stack, g = 3, 4, 1
    w = n + stack
    end = np.full((1, w, g), NOT_ENDED, np.int8)
    end[0, 1, 0] = TERMINATED  # an episode ended after window step 1; step 2 is the next one's first
    end[0, 4, 0] = TRUNCATED  # and that one was cut after step 4
    frames = np.zeros((1, w, g, 2, 2), np.uint8)
    for step in range(w):
        frames[0, step, 0] = step + 1
    t = transitions(_items(end, frames, n, stack), n, stack)
    obs = t["observation"].numpy()[0, :, 0, 0]  # the stack of window steps 0..3, oldest first
    np.testing.assert_array_equal(obs, [0, 0, 3, 4])
    boot = t["next_observation"].numpy()[0, :, 0, 0]  # window steps 3..6; the episode of step 6 began at 5
    np.testing.assert_array_equal(boot, [0, 0, 6, 7])
    assert t["valid"].numpy().tolist() == [0.0]  # steps 3..5 reach the cut after step 4
    assert t["done"].numpy().tolist() == [[0.0, 1.0, 0.0]]


def test_the_single_env_layout_of_earlier_teachers_reads():
    n, stack, k = 3, 4, 2
    frames = np.arange(k * (n + stack) * 4, dtype=np.uint8).reshape(k, n + stack, 2, 2)
    data = dict(
        observation=tf.constant(frames),
        action=tf.constant([[1, 0, 0, 0], [2, 0, 0, 0]], tf.int32),
        reward=tf.ones([k, n + 1], tf.float32),
        done=tf.constant([[False, True, False, False], [False] * 4]),
        policy_version=tf.constant([[5] * 4, [6] * 4], tf.int64),
    )
    t = {key: v.numpy() for key, v in transitions(data, n, stack).items()}
    np.testing.assert_array_equal(t["observation"], frames[:, :stack])
    np.testing.assert_array_equal(t["next_observation"], frames[:, n:])
    assert t["action"].tolist() == [1, 2] and t["valid"].tolist() == [1.0, 1.0]
    assert t["done"].tolist() == [[0, 1, 0], [0, 0, 0]] and t["policy_version"].tolist() == [5, 6]


def test_a_teacher_replay_of_another_layout_is_accepted_and_a_run_table_is_not():
    spec = env_spec("CartPole-v1")
    agent = DQNAgent(spec, make_algo_config("dqn", "default", "CartPole-v1"), seed=0)
    assert agent.signature_error(agent.signature(), source=None) is None
    other_g = dqn_signature((4,), tf.float32, 3, 1, envs=2)
    assert "this run needs" in agent.signature_error(other_g, source=None)
    assert agent.signature_error(other_g, source="teacher") is None
    legacy = {
        "observation": tf.TensorSpec([4, 4], tf.float32),
        "action": tf.TensorSpec([4], tf.int32),
        "reward": tf.TensorSpec([4], tf.float32),
        "done": tf.TensorSpec([4], tf.bool),
        "policy_version": tf.TensorSpec([4], tf.int64),
    }
    assert agent.signature_error(legacy, source="teacher") is None
    acrobot = dqn_signature((6,), tf.float32, 3, 1, envs=4)
    assert "its frames are float32 [6], this run's are float32 [4]" in agent.signature_error(acrobot, source="teacher")
    five_step = dqn_signature((4,), tf.float32, 5, 1, envs=4)
    assert "hold 6 steps" in agent.signature_error(five_step, source="teacher")


def _policy(guide_roll_in: int):
    """Weights whose student always prefers action 0 and whose JSRL guide always prefers action 1."""
    from rlfleet.actors.actor import Policy
    from rlfleet.proto import rlfleet_pb2

    zeros = np.zeros((4, 2), np.float32)
    arrays = {"q/w0": zeros, "q/b0": np.array([1.0, 0.0], np.float32)}
    arrays.update({"guide/q/w0": zeros, "guide/q/b0": np.array([0.0, 1.0], np.float32)})
    exploration = rlfleet_pb2.Exploration(epsilon=0.0, guide_roll_in_steps=guide_roll_in)
    return Policy(7, arrays, exploration)


def test_jsrl_guide_acts_the_first_h_steps_of_each_episode_h_drawn_per_episode():
    """The behaviour's roll-in (JSRL): env i's episode is the guide's for its first h_i steps, h_i in 1..H
    drawn when the episode begins, then the student's; no guide at H = 0."""
    import types

    from rlfleet.algorithms.dqn.items import behaviour

    envs, horizon = 300, 3
    actor = types.SimpleNamespace(
        config=types.SimpleNamespace(num_envs=envs),
        episode_steps=np.zeros(envs, np.int64),
        check_policy_output=lambda *a: None,
    )
    act, rng, obs = behaviour(actor), np.random.default_rng(0), np.zeros((envs, 4), np.float32)
    actions = []
    for _ in range(6):
        actions.append(act(_policy(horizon), obs, rng).action)
        actor.episode_steps = actor.episode_steps + 1
    actions = np.stack(actions, 1)  # [envs, steps]
    guided = actions.sum(1)
    for row, h in zip(actions, guided):
        assert list(row) == [1] * h + [0] * (6 - h)
    assert set(guided.tolist()) == {1, 2, 3}  # every length of 1..H is drawn
    # Episodes that begin again draw their h again; the others stay the student's.
    actor.episode_steps = np.where(np.arange(envs) < 100, 0, actor.episode_steps)
    again = act(_policy(horizon), obs, rng).action
    assert (again[:100] == 1).all() and (again[100:] == 0).all()
    assert (act(_policy(0), obs, rng).action == 0).all()  # H = 0: the student alone
