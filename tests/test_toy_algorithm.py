"""An algorithm defined outside rlfleet, in this file alone, runs through `rlfleet up` to a finished run.

The toy is REINFORCE (Williams 1992) with a linear softmax policy on CartPole-v1: actors sample actions
from softmax(obs·W + b) and write items of T+1 batch steps to a FIFO queue; the learner turns each item
into reward-to-go advantages (discounted within the item, normalised) and takes one plain gradient
ascent step on Σ log π(a|s)·A. Nothing else in the repository names it: every process imports this file
through $RLFLEET_PLUGINS and finds the definition in the registry.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import reverb
import tensorflow as tf

from rlfleet import algorithms
from rlfleet.learner.agents import Agent, StepResult

pytestmark = pytest.mark.slow

TABLE = "toy_reinforce_items"


@dataclasses.dataclass
class ToyConfig:
    """Settings of the toy REINFORCE learner."""

    learning_rate: float = 1.0  # gradient ascent step size (per update)
    discount: float = 0.97  # γ per env step, within an item
    envs_per_actor: int = 8  # envs each actor steps as one batch
    unroll_length: int = 64  # batch steps per replay item (items hold T + 1)
    eval_episodes: int = 5  # episodes per evaluation (greedy action)
    eval_every_updates: int = 10  # updates (policy versions) between evaluations

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)


def _signature(obs_dim: int, num_envs: int, t: int) -> dict:
    lead = [t + 1, num_envs]
    return {
        "observation": tf.TensorSpec(lead + [obs_dim], tf.float32),
        "action": tf.TensorSpec(lead, tf.int32),
        "reward": tf.TensorSpec(lead, tf.float32),
        "done": tf.TensorSpec(lead, tf.bool),
        "policy_version": tf.TensorSpec(lead, tf.int64),
    }


def toy_tables(spec, config: ToyConfig, queue_items: int | None = None) -> list:
    sig = _signature(spec.obs_shape[0], config.envs_per_actor, config.unroll_length)
    return [reverb.Table.queue(TABLE, max_size=queue_items or 4, signature=sig)]


def _logits(arrays: dict, obs: np.ndarray) -> np.ndarray:
    return obs @ arrays["w"] + arrays["b"]


def toy_collect(actor, venv, weights, epoch: int) -> None:
    """One writer per actor; an item of the last T+1 batch steps every T steps."""
    t = actor.config.unroll_length
    rng, obs = actor.start_episodes(venv)
    writer = reverb.Client(actor.replay_address).trajectory_writer(num_keep_alive_refs=t + 1)
    appended = 0
    try:
        while not actor.stop.is_set():
            version, arrays, _ = weights.latest
            actor.policy_version = version
            logits = _logits(arrays, obs)
            p = np.exp(logits - logits.max(1, keepdims=True))
            p /= p.sum(1, keepdims=True)
            action = (rng.random(len(p))[:, None] > np.cumsum(p, 1)).sum(1).astype(np.int32)
            next_obs, reward, terminated, truncated, _ = venv.step(action)
            actor.check_finite(next_obs, reward)
            done = np.logical_or(terminated, truncated)
            writer.append(
                dict(
                    observation=np.asarray(obs, np.float32),
                    action=action,
                    reward=np.asarray(reward, np.float32),
                    done=done,
                    policy_version=np.full(len(done), version, np.int64),
                )
            )
            appended += 1
            if appended > t and (appended - 1) % t == 0:
                writer.create_item(TABLE, 1.0, {k: col[-(t + 1) :] for k, col in writer.history.items()})
                if not actor.wait_written(writer, epoch):
                    break
            obs = next_obs
            actor.count_steps(reward, done)
    finally:
        writer.close()


class ToyAgent(Agent):
    algo, table = "toy_reinforce", TABLE

    def __init__(self, spec, config: ToyConfig, seed: int, total_steps: int = 0):
        self.spec, self.config, self.unroll_length = spec, config, config.unroll_length
        obs_dim, n = spec.obs_shape[0], spec.action_dim
        self.w = tf.Variable(np.zeros((obs_dim, n), np.float32))
        self.b = tf.Variable(np.zeros(n, np.float32))
        self.entropy = float(np.log(n))

    def signature(self) -> dict:
        return _signature(self.spec.obs_shape[0], self.config.envs_per_actor, self.config.unroll_length)

    def actor_network(self) -> dict:
        return dict(observation_shape=list(self.spec.obs_shape), num_actions=self.spec.action_dim)

    def export_weights(self) -> dict:
        return {"w": self.w.numpy(), "b": self.b.numpy()}

    def checkpoint_items(self) -> dict:
        return {"toy_w": self.w, "toy_b": self.b}

    def samples(self, replay_address: str):
        client = reverb.Client(replay_address)
        for sample in client.sample(TABLE, num_samples=2**62, emit_timesteps=False, unpack_as_table_signature=True):
            yield sample.data

    def consume(self, item, policy_version: int, env_steps: int) -> StepResult:
        obs, action = item["observation"][:-1], item["action"][:-1]
        reward, done = item["reward"][:-1], item["done"][:-1]
        advantage = np.zeros_like(reward)
        running = np.zeros(reward.shape[1], np.float32)
        for k in reversed(range(len(reward))):
            running = reward[k] + self.config.discount * running * ~done[k]
            advantage[k] = running
        advantage = (advantage - advantage.mean()) / (advantage.std() + 1e-8)
        x, a, adv = obs.reshape(-1, obs.shape[-1]), action.reshape(-1), advantage.reshape(-1)
        logits = _logits(self.export_weights(), x)
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        g = (np.eye(p.shape[1], dtype=np.float32)[a] - p) * adv[:, None]  # ∂ log π(a|s) / ∂ logits × A
        self.w.assign_add(self.config.learning_rate * x.T @ g / len(x))
        self.b.assign_add(self.config.learning_rate * g.mean(0))
        self.entropy = float(-(p * np.log(p + 1e-8)).sum(1).mean())
        return StepResult(gradient_steps=1, consumed=reward.size, updated=True, metrics={"entropy": self.entropy})

    def evaluate(self, episodes: int, seed: int) -> list[float]:
        env, returns = gym.make(self.spec.env_id), []
        for i in range(episodes):
            obs, _ = env.reset(seed=seed + i)
            total, over = 0.0, False
            while not over:
                obs, r, term, trunc, _ = env.step(int(_logits(self.export_weights(), obs[None]).argmax()))
                total, over = total + r, term or trunc
            returns.append(total)
        env.close()
        return returns

    def status_extras(self) -> dict:
        return {"policy_entropy": self.entropy}


algorithms.register(
    algorithms.Algorithm(
        name="toy_reinforce",
        summary="test-only REINFORCE, discrete actions",
        action_space="discrete",
        config_class=ToyConfig,
        presets={"default": {}},
        tables=toy_tables,
        collect=toy_collect,
        agent=ToyAgent,
        progress_values={"policy_entropy": ("policy entropy", "{:.3f}")},
    )
)


def _rlfleet(*args, timeout=600):
    env = dict(os.environ, RLFLEET_PLUGINS=os.path.abspath(__file__))
    cmd = [sys.executable, "-m", "rlfleet.deploy.cli", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def test_toy_algorithm_runs_to_a_finished_run(tmp_path):
    run = tmp_path / "run"
    out = _rlfleet(
        "up", "--algo", "toy_reinforce", "--env", "CartPole-v1", "--total-steps", 40_000, "--logdir", run,
        "--report-interval", 1,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["algo"] == "toy_reinforce" and summary["completed"] and summary["env_steps"] >= 40_000
    # One update per item consumed (the run ends on the actors' count, with a few items still queued).
    assert summary["consumed_env_steps"] == summary["learner_steps"] * 8 * 64 and summary["learner_steps"] >= 40
    assert "policy entropy" in out.stdout  # the definition's progress key, from the status map
    assert 0 < summary["policy_entropy"] < np.log(2)  # it moved away from the uniform policy
    # The policy learned: its greedy action at the start (zero weights: always action 0) scores about 9; after
    # 40k env steps seeds 0-3 evaluated 112-330.
    assert summary["final_eval_return_mean"] >= 60, summary
    run_json = json.loads((run / "run.json").read_text())
    assert run_json["algo"] == "toy_reinforce" and run_json["config"]["learning_rate"] == 1.0


def test_toy_algorithm_settings_and_unknown_names():
    shown = _rlfleet("up", "--algo", "toy_reinforce", "--env", "CartPole-v1", "--show-config", timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "gradient ascent step size (per update)" in shown.stdout
    wrong_env = _rlfleet(
        "up", "--algo", "toy_reinforce", "--env", "Pendulum-v1", "--total-steps", 1000, "--logdir", "/nonexistent",
        timeout=120,
    )  # fmt: skip
    assert wrong_env.returncode == 2 and "needs discrete actions" in wrong_env.stderr
    unknown = _rlfleet("up", "--algo", "impala", "--env", "CartPole-v1", "--show-config", timeout=120)
    assert unknown.returncode == 2
    assert "--algo impala: no such algorithm (registered: ppo, dqn, qdagger, toy_reinforce)" in unknown.stderr


def test_a_plugin_that_fails_or_is_missing_is_named(procs, free_port, tmp_path):
    from helpers import ENV, wait_for

    broken = tmp_path / "broken_plugin.py"
    broken.write_text("raise RuntimeError('boom in the plugin')\n")
    env = dict(os.environ, RLFLEET_PLUGINS=f"{os.path.abspath(__file__)},{broken}")
    cmd = [sys.executable, "-m", "rlfleet.deploy.cli", "up", "--algo", "ppo", "--env", "Hopper-v5", "--show-config"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 2 and "cannot import the algorithm plugin" in out.stderr
    assert "broken_plugin.py" in out.stderr and "boom in the plugin" in out.stderr
    # A learner that runs the plugin's algorithm, and an actor machine that lacks the plugin.
    replay_port, learner_port = free_port(), free_port()
    run_config = tmp_path / "settings.json"
    with_plugin = dict(ENV, RLFLEET_PLUGINS=os.path.abspath(__file__))
    written = _rlfleet("settings", "--algo", "toy_reinforce", "--env", "CartPole-v1", "--out", run_config)
    assert written.returncode == 0, written.stderr
    replay = procs.start("replay", "replay", "--run-config", run_config, "--port", replay_port, env=with_plugin)
    learner = procs.start(
        "learner", "learner", "--run-config", run_config, "--replay", f"127.0.0.1:{replay_port}",
        "--logdir", tmp_path / "run", "--port", learner_port, env=with_plugin,
    )  # fmt: skip
    wait_for(lambda: "serving on" in learner.output(), 120, "the learner", [replay, learner])
    actor = procs.start("actor", "actor", "--learner", f"127.0.0.1:{learner_port}")  # no RLFLEET_PLUGINS
    assert actor.proc.wait(timeout=120) == 2
    assert "runs algorithm 'toy_reinforce', which this machine cannot run" in actor.output()
    assert "RLFLEET_PLUGINS" in actor.output()
