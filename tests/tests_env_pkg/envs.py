"""Corridor-v0: walk right along a corridor of `length` cells to its end. Registered with gymnasium on import, as
a user's package would register its envs (`--env tests_env_pkg.envs:Corridor-v0` imports this module).

Observation: float32 [length], one-hot of the current cell (so that its size shows which `length` a process
made). Actions: 0 left, 1 right. Reward: 1 at the end, which terminates the episode; episodes are truncated after
32 steps. `busy_seconds` > 0 makes each step compute for that long (a CPU-bound Python env, as an expensive
simulator would be). `fail_seeds_from` > 0 makes a reset with a seed from there on raise (a user's env with a
bug that the learner's evaluation episodes, seeded from 10**6 on, run into and the actors' envs do not);
`nan_from_seed` > 0 makes a reset with a seed from there on return a NaN observation. `action_start` numbers the
actions from there (gymnasium's Discrete start); `obs_offset` != 0 gives float64 observations, offset by it;
`fail_after_steps` > 0 makes a step raise once the env has taken that many. `hang_after_steps` > 0 makes a step
hang once the env has taken that many, and `hang_seeds_from` > 0 a reset with a seed from there on: in a Python
loop (`hang` "loop") or in a system call (`hang` "sleep"), as a user's env stuck in its own code or waiting on a
simulator that died would.
"""

import os
import time

import gymnasium as gym
import numpy as np


class Corridor(gym.Env):
    """The corridor (module doc); `length` cells, at least 2."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(
        self,
        length: int = 8,
        render_mode: str | None = None,
        busy_seconds: float = 0.0,
        fail_seeds_from: int = 0,
        nan_from_seed: int = 0,
        action_start: int = 0,
        obs_offset: float = 0.0,
        fail_after_steps: int = 0,
        hang_after_steps: int = 0,
        hang_seeds_from: int = 0,
        hang: str = "loop",
    ):
        if length < 2:
            raise ValueError(f"length must be at least 2, not {length}")
        self.length, self.render_mode, self.busy_seconds = int(length), render_mode, float(busy_seconds)
        self.fail_seeds_from, self.nan_from_seed = int(fail_seeds_from), int(nan_from_seed)
        self.offset = float(obs_offset)
        dtype = np.float64 if self.offset else np.float32
        self.observation_space = gym.spaces.Box(self.offset, self.offset + 1.0, (self.length,), dtype)
        self.action_space = gym.spaces.Discrete(2, start=int(action_start))
        self.start, self.fail_after_steps, self.steps = int(action_start), int(fail_after_steps), 0
        self.position = 0
        self.hang_after_steps, self.hang_seeds_from, self.hang = int(hang_after_steps), int(hang_seeds_from), hang

    def _hang(self):
        """Never returns (the module doc's `hang`)."""
        while True:
            if self.hang == "sleep":
                time.sleep(3600)

    def _obs(self):
        obs = np.zeros(self.length, self.observation_space.dtype)
        obs[self.position] = 1.0
        return obs + self.offset if self.offset else obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if self.fail_seeds_from and seed is not None and seed >= self.fail_seeds_from:
            raise RuntimeError(f"Corridor cannot start from seed {seed}")
        if self.hang_seeds_from and seed is not None and seed >= self.hang_seeds_from:
            self._hang()
        self.position = 0
        if self.nan_from_seed and seed is not None and seed >= self.nan_from_seed:
            return np.full(self.length, np.nan, np.float32), {}
        return self._obs(), {}

    def step(self, action):
        end = time.thread_time() + self.busy_seconds  # CPU time: the step costs the same however loaded the machine
        while time.thread_time() < end:
            pass
        self.steps += 1
        if self.fail_after_steps and self.steps > self.fail_after_steps:
            raise ValueError(f"Corridor broke at its step {self.steps}")
        if self.hang_after_steps and self.steps > self.hang_after_steps:
            self._hang()
        self.position = int(np.clip(self.position + (1 if int(action) - self.start == 1 else -1), 0, self.length - 1))
        at_end = self.position == self.length - 1
        return self._obs(), float(at_end), at_end, False, {}

    def render(self):
        frame = np.full((16, 16 * self.length, 3), 255, np.uint8)
        frame[:, 16 * self.position : 16 * (self.position + 1)] = (200, 30, 30)
        return frame


# $CORRIDOR_TIME_LIMIT: another time limit under the same id, as another version of a user's package would have.
gym.register(id="Corridor-v0", entry_point=Corridor, max_episode_steps=int(os.environ.get("CORRIDOR_TIME_LIMIT", 32)))


class EndlessCorridor(Corridor):
    """The corridor with no end (reaching the last cell keeps the episode going) and, registered, no time limit:
    an env whose episodes never end by themselves."""

    def step(self, action):
        """The corridor's step, never terminated."""
        obs, reward, _, truncated, info = super().step(action)
        return obs, reward, False, truncated, info


gym.register(id="EndlessCorridor-v0", entry_point=EndlessCorridor)
