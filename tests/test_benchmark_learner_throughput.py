"""benchmarks/learner_throughput.py against a real replay server process filled by the real actor-side writer:
every part is measured per minibatch whatever the gradient steps per call, the preset's items hold several envs,
and the server it started is gone when it returns."""

import os
import sys

import psutil
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import learner_throughput  # noqa: E402

pytestmark = pytest.mark.slow


def test_learner_throughput_measures_every_part_per_minibatch_and_stops_its_server(monkeypatch):
    monkeypatch.setitem(learner_throughput.WORKLOADS, "cartpole", ("dqn", "CartPole-v1", {}, 4_000))
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    one = learner_throughput.measure("cartpole", 1, 1, 0.3)
    preset = learner_throughput.measure("cartpole", 0, 0, 0.3)
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before  # the replay servers were stopped
    assert (one["envs_per_item"], one["gradient_steps_per_call"]) == (1, 1)
    assert preset["envs_per_item"] == 4 and preset["gradient_steps_per_call"] == 8  # CartPole's preset
    for r in (one, preset):
        assert r["actor_writer"]["env_steps"] >= 4_000 and r["actor_writer"]["server_cpu_ms"] > 0
        for part in ("input", "train_step", "both", "numpy_gather"):
            v = r[part]
            assert v["calls"] > 0 and v["wall_ms"] > 0 and v["cpu_ms"] > 0, part
            assert v["cpu_us_per_transition"] == pytest.approx(1e3 * (v["cpu_ms"] + v["server_cpu_ms"]) / 64)
        assert r["input"]["server_cpu_ms"] > 0 and r["train_step"]["server_cpu_ms"] == 0
