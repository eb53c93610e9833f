"""QDagger agent without any server: phases, the distillation coefficient and learning-rate schedule."""

import math

import numpy as np
import pytest
from test_dqn_learner import make_batch

from rlfleet.algorithms.dqn.networks import make_q_network
from rlfleet.algorithms.qdagger.agent import OFFLINE, ONLINE, QDaggerAgent
from rlfleet.algorithms.qdagger.teacher import Teacher
from rlfleet.algorithms.settings import make_algo_config
from rlfleet.envs.core import env_spec

SPEC = env_spec("CartPole-v1")


def make_agent(**overrides):
    cfg = make_algo_config("qdagger", "default", "CartPole-v1", {"offline_steps": 3, "publish_every": 2, **overrides})
    teacher = Teacher("teacher-dir", make_q_network(SPEC, cfg, 7, "teacher_q"), "-", None)
    agent = QDaggerAgent(SPEC, cfg, 0, teacher, "-")
    agent.teacher_return, agent.random_return = 200.0, 20.0
    return agent, cfg


def test_offline_phase_ends_after_offline_steps_and_then_publishes():
    agent, cfg = make_agent()
    rng = np.random.default_rng(0)
    assert agent.phase == OFFLINE and not agent.ready_for_actors()
    results = [agent.consume(make_batch(cfg, rng, minibatches=1), 0, env_steps=0) for _ in range(3)]
    assert [r.updated for r in results] == [False, False, True]
    assert results[-1].evaluate and results[-1].metrics["distillation_loss"] >= 0
    assert agent.phase == ONLINE and agent.ready_for_actors()
    online = [agent.consume(make_batch(cfg, rng, minibatches=1), 1, env_steps=100) for _ in range(2)]
    assert [r.updated for r in online] == [True, False]  # learner steps 4 and 5; publish_every = 2


def test_coefficient_follows_the_student_return_online_only():
    agent, cfg = make_agent(distillation_score_episodes=1)
    rng = np.random.default_rng(1)
    agent.on_evaluation([110.0], env_steps=0)  # offline: stays at the base coefficient
    assert float(agent.coefficient.numpy()) == pytest.approx(cfg.distillation_base)
    for _ in range(3):
        agent.consume(make_batch(cfg, rng, minibatches=1), 0, env_steps=0)
    # The evaluation at the end of pretraining: actors step while it runs, so env steps have moved on, but the
    # student has learned nothing online yet.
    agent.on_evaluation([250.0], env_steps=40)
    assert float(agent.coefficient.numpy()) == pytest.approx(cfg.distillation_base)
    agent.consume(make_batch(cfg, rng, minibatches=1), 1, env_steps=60)
    agent.on_evaluation([110.0], env_steps=1000)  # halfway from random (20) to teacher (200)
    assert float(agent.coefficient.numpy()) == pytest.approx(0.5 * cfg.distillation_base)
    lr = float(agent.optimizer.learning_rate.numpy())
    assert lr == pytest.approx(cfg.learning_rate_final + 0.5 * (cfg.learning_rate - cfg.learning_rate_final))
    agent.on_evaluation([250.0], env_steps=2000)  # above the teacher: no more distillation
    assert float(agent.coefficient.numpy()) == 0.0
    assert float(agent.optimizer.learning_rate.numpy()) == pytest.approx(cfg.learning_rate_final)
    agent.on_evaluation([20.0], env_steps=3000)  # once 0, λ stays 0 (reincarnating_rl's record_score)
    assert float(agent.coefficient.numpy()) == 0.0


def test_coefficient_waits_for_a_window_of_episodes_and_uses_their_mean():
    agent, cfg = make_agent(distillation_score_episodes=4)
    rng = np.random.default_rng(3)
    for _ in range(4):  # 3 offline steps, 1 online
        agent.consume(make_batch(cfg, rng, minibatches=1), 0, env_steps=0)
    base = cfg.distillation_base
    agent.on_evaluation([300.0, 300.0], env_steps=1000)  # one lucky evaluation, 2 of 4 episodes: λ holds
    assert float(agent.coefficient.numpy()) == pytest.approx(base) and math.isnan(agent.score_return)
    agent.on_evaluation([20.0, 20.0], env_steps=2000)  # mean of 300, 300, 20, 20 = 160: 7/9 of the way
    assert float(agent.coefficient.numpy()) == pytest.approx(base * (1 - 140 / 180), rel=1e-5)
    assert agent.score_return == pytest.approx(160.0)
    agent.on_evaluation([20.0, 20.0], env_steps=3000)  # the two 300s leave the window: the mean is random's
    assert float(agent.coefficient.numpy()) == pytest.approx(base)
    # The window is part of the checkpoint: a resumed student continues from the same episodes.
    items = agent.checkpoint_items()
    assert int(items["distillation_score_played"].numpy()) == 6  # episodes played; the ring keeps the last 4
    assert sorted(items["distillation_score_returns"].numpy().tolist()) == [20.0, 20.0, 20.0, 20.0]
    resumed, _ = make_agent(distillation_score_episodes=4)
    for key in ("distillation_score_played", "distillation_score_returns"):
        resumed.checkpoint_items()[key].assign(items[key])
    resumed.sync_from_checkpoint()
    assert resumed.score_return == pytest.approx(20.0)


def test_without_a_score_window_each_evaluation_sets_the_coefficient():
    """distillation_score_episodes = 0: λ from each evaluation alone, and no ring of scores in the checkpoint."""
    agent, cfg = make_agent(distillation_score_episodes=0, teacher_eval_episodes=0)
    assert "distillation_score_returns" not in agent.checkpoint_items()
    rng = np.random.default_rng(5)
    for _ in range(4):
        agent.consume(make_batch(cfg, rng, minibatches=1), 0, env_steps=0)
    agent.on_evaluation([110.0], env_steps=100)
    assert float(agent.coefficient.numpy()) == pytest.approx(0.5 * cfg.distillation_base)


def test_without_offline_pretraining_the_online_phase_starts_at_the_first_step():
    agent, cfg = make_agent(offline_steps=0, distillation_score_episodes=1)
    rng = np.random.default_rng(6)
    assert agent.phase == ONLINE
    agent.consume(make_batch(cfg, rng, minibatches=1), 0, env_steps=500)
    assert int(agent.online_start_env_steps.numpy()) == 500
    agent.on_evaluation([110.0], env_steps=900)
    assert float(agent.coefficient.numpy()) == pytest.approx(0.5 * cfg.distillation_base)


def test_online_phase_starts_with_the_target_network_copied_from_the_student():
    agent, cfg = make_agent(target_update_period=1000)
    rng = np.random.default_rng(4)
    for _ in range(3):
        agent.consume(make_batch(cfg, rng, minibatches=1), 0, env_steps=0)
    assert agent.phase == ONLINE
    for t, s in zip(agent.target_q.trainable_variables, agent.q.trainable_variables):
        np.testing.assert_array_equal(t.numpy(), s.numpy())


def test_hard_cutoff_stops_distillation():
    agent, cfg = make_agent(distillation_cutoff_env_steps=500)
    rng = np.random.default_rng(2)
    for _ in range(3):
        agent.consume(make_batch(cfg, rng, minibatches=1), 0, env_steps=0)
    agent.consume(make_batch(cfg, rng, minibatches=1), 1, env_steps=499)
    assert float(agent.coefficient.numpy()) == pytest.approx(cfg.distillation_base)
    agent.consume(make_batch(cfg, rng, minibatches=1), 1, env_steps=500)
    assert float(agent.coefficient.numpy()) == 0.0
    assert math.isclose(float(agent.optimizer.learning_rate.numpy()), cfg.learning_rate_final, rel_tol=1e-5)


def test_jsrl_roll_in_bound_decays_as_reincarnating_rl_truncating_each_time():
    """int(H · 0.8) once per period: 100, 80, 64, 51, 40, 32, 25, 20, 16, 12, 9, 7, 5, 4, 3, 2, 1, 0 (17 decays)."""
    from rlfleet.algorithms.qdagger.agent import guide_bound

    seen = [guide_bound(100, 0.8, 1000, k * 1000) for k in range(19)]
    assert seen == [100, 80, 64, 51, 40, 32, 25, 20, 16, 12, 9, 7, 5, 4, 3, 2, 1, 0, 0]
    assert guide_bound(100, 0.8, 1000, 999) == 100 and guide_bound(100, 0.8, 1000, 1000) == 80
    assert guide_bound(100, 0.8, 0, 10**9) == 100 and guide_bound(0, 0.8, 1, 50) == 0
