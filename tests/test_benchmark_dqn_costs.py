"""benchmarks/dqn_costs.py against a real replay server process: every part is measured, the per-env-step sums
follow from the parts at the preset's schedule, and the server it started is gone when it returns."""

import os
import sys

import psutil
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import dqn_costs  # noqa: E402

from rlfleet.algorithms.settings import make_algo_config  # noqa: E402

pytestmark = pytest.mark.slow


def test_dqn_costs_measures_every_part_and_stops_its_server():
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    r = dqn_costs.costs("CartPole-v1", 0.3)
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before  # the replay server was stopped
    cfg = make_algo_config("dqn", "default", "CartPole-v1")
    ratio = cfg.samples_per_insert / cfg.batch_size
    assert r["gradient_steps_per_env_step"] == ratio
    for part in ("actor_env_and_policy", "actor_with_writes", "reverb_minibatch", "numpy_minibatch", "consume"):
        assert r[part]["calls"] > 0 and r[part]["wall_ms"] > 0, part
    assert r["actor_with_writes"]["server_cpu_ms"] >= 0 and r["reverb_minibatch"]["server_cpu_ms"] > 0
    per = r["per_env_step_cpu_ms"]
    assert per["learner_sampling"] == pytest.approx(ratio * r["reverb_minibatch"]["cpu_ms"])
    assert per["learner_update"] == pytest.approx(ratio * r["consume"]["cpu_ms"])
    assert r["total_cpu_ms"] == pytest.approx(sum(per.values()))
    assert r["single_process_total_cpu_ms"] == pytest.approx(sum(r["single_process_cpu_ms"].values()))
