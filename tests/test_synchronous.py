"""PPO's synchronous mode, the on-policy control: every env step trained on was acted on by the policy version
that trains on it (real processes on loopback), and the asynchronous mode's lag is measured the same way."""

import json
import re

import numpy as np
import pytest
from helpers import rlfleet, rows_as_scalars, tensorboard_scalars

# Pendulum-v1: a continuous-action env cheap enough to step in-process. Two actors of 2 envs, items of 64
# steps: a batch of 512 env steps is 4 items, 2 from each actor.
SETTINGS = [
    "--set",
    "unroll_length=64",
    "--set",
    "batch_env_steps=512",
    "--set",
    "eval_every_updates=1000",
    "--set",
    "eval_episodes=1",
]


def _run(tmp_path, name, *more, actors=2, total_steps=8000):
    logdir = tmp_path / name
    out = rlfleet(
        "up",
        "--algo",
        "ppo",
        "--env",
        "Pendulum-v1",
        "--actors",
        str(actors),
        "--envs-per-actor",
        "2",
        "--total-steps",
        str(total_steps),
        "--report-interval",
        "1",
        "--logdir",
        logdir,
        *SETTINGS,
        *more,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    summary = json.loads((logdir / "summary.json").read_text())
    # Progress rows after the end (the learner serves status a few seconds longer) show the summary's count.
    after_end = re.findall(r"\] done\s+env steps\s+([\d,]+)/", out.stdout)
    assert all(int(n.replace(",", "")) == summary["env_steps"] for n in after_end), (after_end, summary)
    rows = [json.loads(line) for line in (logdir / "metrics.jsonl").read_text().splitlines()]
    updates = [r for r in rows if r.get("policy_lag_max") is not None]
    # One row per update, with the counters after it; the rows every report interval carry no diagnostics.
    assert [r["policy_version"] for r in updates] == list(range(1, summary["policy_version"] + 1)), updates
    assert sum(r["gradient_steps"] for r in updates) == summary["learner_steps"] == updates[-1]["learner_steps"]
    intervals = [r for r in rows if "phase" in r]
    assert intervals and not any("approx_kl" in r for r in intervals), intervals
    # TensorBoard holds each row's numbers, at the row's env steps, and nothing else.
    assert rows_as_scalars(rows) == tensorboard_scalars(logdir / "tb")
    return summary, updates


@pytest.mark.slow
def test_synchronous_actors_collect_each_batch_with_the_version_that_trains_on_it(tmp_path):
    summary, rows = _run(tmp_path, "sync", "--set", "synchronous=true")
    assert summary["consumed_env_steps"] >= 6 * 512 and summary["learner_steps"] > 0
    assert summary["off_policy_env_steps"] == 0, summary
    assert rows and all(r["policy_lag_max"] == 0 and r["off_policy_fraction"] == 0 for r in rows), rows
    # The actors wait for each new version instead of collecting on: nothing is dropped for lag beyond the
    # first version's batch, which is shared out before the actors register (each then writes all 4 items).
    assert summary["dropped_env_steps"] <= 512, summary
    for key in ("approx_kl", "clip_fraction", "entropy", "explained_variance", "max_importance_weight"):
        assert all(key in r for r in rows), key


@pytest.mark.slow
def test_asynchronous_actors_run_ahead_and_the_lag_is_counted(tmp_path):
    summary, rows = _run(tmp_path, "async")
    assert summary["off_policy_env_steps"] > 0 and isinstance(summary["off_policy_env_steps"], int), summary
    assert max(r["policy_lag_max"] for r in rows) >= 1, rows


@pytest.mark.slow
def test_asynchronous_actors_with_batch_long_items_drop_nothing(tmp_path):
    # One item of 2 envs x 256 steps is the whole batch: every item held ahead is a policy version of lag.
    summary, rows = _run(tmp_path, "credit", "--set", "unroll_length=256", actors=1)
    assert summary["consumed_env_steps"] >= 6 * 512, summary
    assert summary["dropped_env_steps"] == 0, summary
    assert max(r["policy_lag_max"] for r in rows) <= 3, rows


def test_synchronous_needs_a_batch_of_env_steps():
    out = rlfleet(
        "settings", "--algo", "ppo", "--env", "Pendulum-v1", "--set", "synchronous=true", "--set", "batch_episodes=4"
    )
    assert out.returncode != 0 and "synchronous=true needs a batch of env steps" in out.stderr, out.stderr[-2000:]


def test_the_batch_is_shared_out_over_the_actors_and_a_lost_actor_does_not_stall_it():
    from rlfleet.algorithms.ppo.agent import PPOAgent
    from rlfleet.algorithms.ppo.config import make_config
    from rlfleet.envs.core import env_spec

    spec = env_spec("Pendulum-v1")
    settings = {"synchronous": True, "envs_per_actor": 2, "unroll_length": 64, "batch_env_steps": 512}
    agent = PPOAgent(spec, make_config("default", "Pendulum-v1", settings), 0)
    assert [agent.items_per_actor(k) for k in (0, 1, 2, 3, 4, 8)] == [4, 4, 2, 2, 1, 1]
    asynchronous = PPOAgent(spec, make_config("default", "Pendulum-v1", dict(settings, synchronous=False)), 0)
    assert asynchronous.items_per_actor(2) == 0 and asynchronous.on_idle(0, 0, 0) is None
    assert asynchronous.item_credit(2) == (2.0, 3) and asynchronous.item_credit(3) == (4 / 3, 3)
    assert agent.item_credit(2) == (0.0, 0)  # synchronous: items_per_actor is the limit
    agent.items_per_actor(2)
    assert agent.on_idle(0, 0, 2) is None  # nothing held
    rng = np.random.default_rng(0)
    t, n, obs_dim, act_dim = 64, 2, spec.obs_shape[0], spec.action_dim
    obs = rng.standard_normal((t + 1, n, obs_dim)).astype(np.float32)
    item = dict(
        observation=obs,
        action=rng.standard_normal((t + 1, n, act_dim)).astype(np.float32),
        reward=rng.standard_normal((t + 1, n)).astype(np.float32),
        terminated=np.zeros((t + 1, n), bool),
        truncated=np.zeros((t + 1, n), bool),
        final_observation=np.zeros_like(obs),
        discounted_return=np.zeros((t + 1, n), np.float32),
        behaviour_log_prob=np.full((t + 1, n), -1.0, np.float32),
        behaviour_mean=np.zeros((t + 1, n, act_dim), np.float32),
        behaviour_log_std=np.zeros((t + 1, n, act_dim), np.float32),
        policy_version=np.zeros((t + 1, n), np.int64),
    )
    assert not agent.consume(item, 0, 128).updated  # 1 of the batch's 4 items
    assert agent.consume(dict(item, policy_version=item["policy_version"] - 1), 0, 256).dropped == t * n
    assert agent.on_idle(0, 256, 2) is None  # both actors are still there: their items are coming
    result = agent.on_idle(0, 256, 1)  # one left: the update runs on what was collected
    assert result.updated and result.consumed == t * n and result.metrics["policy_lag_max"] == 0
    assert agent.on_idle(0, 256, 1) is None


@pytest.mark.slow
def test_a_synchronous_run_is_reproducible_from_its_seed(tmp_path):
    # One actor: its items reach the learner in one order. The learning-rate schedule runs on the env steps
    # trained on, not on those the heartbeats reported by then, so nothing of the timing reaches the updates.
    runs = [
        _run(tmp_path, f"seed-{i}", "--set", "synchronous=true", "--seed", "5", actors=1, total_steps=4000)
        for i in range(2)
    ]
    (first, _), (second, _) = runs
    assert first["learner_steps"] == second["learner_steps"] > 0
    assert first["final_eval_returns"] == second["final_eval_returns"], (first, second)
    by_version = [{r["policy_version"]: (r["approx_kl"], r["learning_rate"]) for r in rows} for _, rows in runs]
    shared = set(by_version[0]) & set(by_version[1])
    assert shared and all(by_version[0][v] == by_version[1][v] for v in shared), by_version
