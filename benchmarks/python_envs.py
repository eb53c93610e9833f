"""Pure-Python envs of the kind users bring, for the env-backend benchmarks: registered with gymnasium on import,
as a user's package would register its own (`--env python_envs:PointMass-v0`, with this folder on PYTHONPATH).

PointMass-v0: a point mass on a plane pushed towards the origin. Observation float64 [4] (position, velocity);
action float32 [2] in [-1, 1] (force); reward −|position|² − 0.01·|action|² per step; episodes are truncated
after 200 steps and never terminate. `busy_seconds` > 0 makes each step compute for that long in Python (CPU
time), as an expensive simulator would: 0 is a cheap step (microseconds), 0.001 a 1 ms one.
"""

import time

import gymnasium as gym
import numpy as np


class PointMass(gym.Env):
    """The point mass (module doc)."""

    def __init__(self, busy_seconds: float = 0.0, dt: float = 0.05):
        self.busy_seconds, self.dt = float(busy_seconds), float(dt)
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float64)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.state = np.zeros(4)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.state = np.concatenate([self.np_random.uniform(-1.0, 1.0, 2), np.zeros(2)])
        return self.state.copy(), {}

    def step(self, action):
        end = time.thread_time() + self.busy_seconds
        while time.thread_time() < end:
            pass
        force = np.clip(np.asarray(action, np.float64), -1.0, 1.0)
        velocity = self.state[2:] + self.dt * force
        position = self.state[:2] + self.dt * velocity
        self.state = np.concatenate([position, velocity])
        reward = -float(position @ position) - 0.01 * float(force @ force)
        return self.state.copy(), reward, False, False, {}


gym.register(id="PointMass-v0", entry_point=PointMass, max_episode_steps=200)
