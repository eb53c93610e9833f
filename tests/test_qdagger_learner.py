"""QDagger agent without any server: phases, the distillation coefficient and learning-rate schedule."""

import math

import numpy as np
import pytest
from test_dqn_learner import make_batch

from rlfleet.actors.envs import env_spec
from rlfleet.learner.dqn import make_q_network
from rlfleet.learner.presets import make_algo_config
from rlfleet.learner.qdagger import OFFLINE, ONLINE, QDaggerAgent
from rlfleet.learner.teacher import Teacher

SPEC = env_spec("CartPole-v1")


def make_agent(**overrides):
    cfg = make_algo_config("qdagger", "default", "CartPole-v1", dict(offline_steps=3, publish_every=2, **overrides))
    teacher = Teacher("teacher-dir", make_q_network(SPEC, cfg, 7, "teacher_q"), "-", None)
    agent = QDaggerAgent(SPEC, cfg, 0, teacher, "-")
    agent.teacher_return, agent.random_return = 200.0, 20.0
    return agent, cfg


def test_offline_phase_ends_after_offline_steps_and_then_publishes():
    agent, cfg = make_agent()
    rng = np.random.default_rng(0)
    assert agent.phase == OFFLINE and not agent.ready_for_actors()
    results = [agent.consume(make_batch(cfg, rng), 0, env_steps=0) for _ in range(3)]
    assert [r.updated for r in results] == [False, False, True]
    assert results[-1].evaluate and results[-1].metrics["distillation_loss"] >= 0
    assert agent.phase == ONLINE and agent.ready_for_actors()
    online = [agent.consume(make_batch(cfg, rng), 1, env_steps=100) for _ in range(2)]
    assert [r.updated for r in online] == [True, False]  # learner steps 4 and 5; publish_every = 2


def test_coefficient_follows_the_student_return_online_only():
    agent, cfg = make_agent()
    rng = np.random.default_rng(1)
    agent.on_evaluation([110.0], env_steps=0)  # offline: stays at the base coefficient
    assert float(agent.coefficient.numpy()) == pytest.approx(cfg.distillation_base)
    for _ in range(3):
        agent.consume(make_batch(cfg, rng), 0, env_steps=0)
    agent.on_evaluation([110.0], env_steps=1000)  # halfway from random (20) to teacher (200)
    assert float(agent.coefficient.numpy()) == pytest.approx(0.5 * cfg.distillation_base)
    lr = float(agent.optimizer.learning_rate.numpy())
    assert lr == pytest.approx(cfg.learning_rate_final + 0.5 * (cfg.learning_rate - cfg.learning_rate_final))
    agent.on_evaluation([250.0], env_steps=2000)  # above the teacher: no more distillation
    assert float(agent.coefficient.numpy()) == 0.0
    assert float(agent.optimizer.learning_rate.numpy()) == pytest.approx(cfg.learning_rate_final)


def test_hard_cutoff_stops_distillation():
    agent, cfg = make_agent(distillation_cutoff_env_steps=500)
    rng = np.random.default_rng(2)
    for _ in range(3):
        agent.consume(make_batch(cfg, rng), 0, env_steps=0)
    agent.consume(make_batch(cfg, rng), 1, env_steps=499)
    assert float(agent.coefficient.numpy()) == pytest.approx(cfg.distillation_base)
    agent.consume(make_batch(cfg, rng), 1, env_steps=500)
    assert float(agent.coefficient.numpy()) == 0.0
    assert math.isclose(float(agent.optimizer.learning_rate.numpy()), cfg.learning_rate_final, rel_tol=1e-5)
