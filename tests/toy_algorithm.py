"""A toy algorithm defined outside rlfleet, in this file alone (tests/test_toy_algorithm.py runs it).

The toy is REINFORCE (Williams 1992) with a linear softmax policy on CartPole-v1: actors sample actions
from softmax(obs·W + b) and write items of T+1 batch steps to a FIFO queue; the learner turns each item
into reward-to-go advantages (discounted within the item, normalised) and takes one plain gradient
ascent step on Σ log π(a|s)·A. Nothing in the product names it: as a plugin, every process imports this file
through $RLFLEET_PLUGINS and finds the builder in the registry; as a built-in, this file is the `__init__.py`
of a folder under `algorithms/` named in the registry's `BUILTIN`.
"""

from __future__ import annotations

import dataclasses
import json

import gymnasium as gym
import numpy as np
import reverb
import tensorflow as tf

from rlfleet import algorithms
from rlfleet.actors.adders import Act, SequenceAdder, sequence_signature
from rlfleet.algorithms.base import Agent, AlgorithmBuilder, StepResult

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
    observation, action = tf.TensorSpec([obs_dim], tf.float32), tf.TensorSpec([], tf.int32)
    return sequence_signature(observation, action, num_envs, t + 1, {})


def toy_tables(spec, config: ToyConfig, queue_items: int | None = None) -> list:
    sig = _signature(spec.obs_shape[0], config.envs_per_actor, config.unroll_length)
    return [reverb.Table.queue(TABLE, max_size=queue_items or 4, signature=sig)]


def _logits(arrays: dict, obs: np.ndarray) -> np.ndarray:
    return obs @ arrays["w"] + arrays["b"]


def toy_behaviour(actor):
    """Samples each env's action from the softmax policy of the latest weights."""

    def act(policy, obs, rng) -> Act:
        logits = _logits(policy.arrays, obs)
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        action = (rng.random(len(p))[:, None] > np.cumsum(p, 1)).sum(1).astype(np.int32)
        return Act(action, action, {})

    return act


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
        reward, done = item["reward"][:-1], (item["terminated"] | item["truncated"])[:-1]
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


class ToyReinforce(AlgorithmBuilder["ToyConfig"]):
    name = "toy_reinforce"
    summary = "test-only REINFORCE, discrete actions"
    action_space = "discrete"
    progress_values = {"policy_entropy": ("policy entropy", "{:.3f}")}

    def config_class(self):
        return ToyConfig

    def presets(self):
        return {"default": {}}

    def make_tables(self, spec, config, queue_items):
        return toy_tables(spec, config, queue_items)

    def behaviour(self, actor):
        return toy_behaviour(actor)

    def adder(self, actor, weights, epoch):
        return SequenceAdder(actor, weights, epoch)  # items of T+1 batch steps, consecutive ones sharing one

    def make_agent(self, spec, config, seed, total_steps, sources=()):
        return ToyAgent(spec, config, seed, total_steps)


algorithms.register(ToyReinforce())
