"""The "workers" env backend: a few worker processes, each stepping several envs in a row.

One process per env (the "async" backend) pays a process round trip per env and per step; an env whose step
costs about as much as the round trip gains nothing from it. Here each of W worker processes holds B / W of the
batch's envs and steps them one after another (as Sample Factory's rollout workers and envpool's threads do), so
a batch step costs one round trip per worker, and the W workers step in parallel on W cores. The processes,
their pipes and the observations in shared memory are gymnasium's `AsyncVectorEnv`'s; each of its sub-envs is an
`EnvGroup` of B / W envs.
"""

from __future__ import annotations

import functools
import math
import os

import gymnasium as gym
import numpy as np

# Keys of an EnvGroup's step info: the last observation of each env whose episode ended in that step (zeros
# elsewhere) and which envs those are. gymnasium stacks array infos of the workers into [W, K, ...].
_FINAL_OBS, _FINISHED = "group_final_obs", "group_finished"


def _cgroup_cpu_limit(proc_cgroup: str = "/proc/self/cgroup", mount: str = "/sys/fs/cgroup") -> float | None:
    """The CPU quota of this process's cgroup in cores, the smallest along its path from its own cgroup up to the
    root (cgroup v2 `cpu.max`, else v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`, the path read from
    /proc/self/cgroup), or None where there is none or it cannot be read. A container's CPU limit (Kubernetes'
    `resources.limits.cpu`, `docker run --cpus`) and a systemd unit's `CPUQuota` are such quotas. `proc_cgroup`
    and `mount` (where the cgroup filesystem is mounted) are parameters for tests."""
    paths = {}  # controller ("" for cgroup v2) -> the process's cgroup path
    try:
        with open(proc_cgroup) as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                for controller in controllers.split(","):
                    paths[controller] = path
    except (OSError, ValueError):
        pass

    def v2(folder):
        with open(os.path.join(folder, "cpu.max")) as f:
            quota, period = f.read().split()[:2]
        return None if quota == "max" else int(quota) / int(period)

    def v1(folder):
        with open(os.path.join(folder, "cpu.cfs_quota_us")) as f:
            quota = int(f.read())
        with open(os.path.join(folder, "cpu.cfs_period_us")) as f:
            period = int(f.read())
        return None if quota <= 0 or period <= 0 else quota / period

    for root, path, read in ((mount, paths.get(""), v2), (os.path.join(mount, "cpu"), paths.get("cpu"), v1)):
        found, limits = False, []
        parts = [p for p in (path or "").split("/") if p]
        for depth in range(len(parts), -1, -1):  # its own cgroup first, then each parent, the root last
            try:
                limit = read(os.path.join(root, *parts[:depth]))
            except (OSError, ValueError):
                continue  # not there (another cgroup namespace's path) or no such file: go up
            found = True
            if limit is not None:
                limits.append(limit)
        if found:
            return min(limits) if limits else None
    return None


def usable_cores() -> int:
    """CPU cores this process may use: its affinity mask (`os.cpu_count()` where there is none), capped by its
    cgroup's CPU quota rounded up (at least 1)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    limit = _cgroup_cpu_limit()
    return max(1, min(cores, math.ceil(limit))) if limit else cores


def worker_count(num_envs: int, cores: int | None = None) -> int:
    """The workers for a batch of `num_envs` envs: the largest divisor of `num_envs` that is at most the usable
    cores (every worker holds the same number of envs)."""
    cores = usable_cores() if cores is None else cores
    if num_envs < 1:
        raise ValueError(f"a batch of {num_envs} envs: give at least 1 env per actor")
    return max(w for w in range(1, min(num_envs, max(1, cores)) + 1) if num_envs % w == 0)


class EnvGroup(gym.Env):
    """K envs (made by `env_fns`, K callables that each return one gymnasium env; picklable, as they travel to
    the worker process) stepped one after another in one process, as one env with a leading K axis.

    Shapes: observation [K, *obs_shape] (gymnasium's batched space of the env's); action [K, *action_shape];
    step returns reward float64 [K], terminated and truncated bool [K]. A finished env is reset in the same step
    (SAME_STEP autoreset); its episode's last observation is in info["group_final_obs"] [K, *obs_shape] (zeros
    for the others) where info["group_finished"] [K] is set. reset(seed=s) seeds env k with s + k (s an int) or
    s[k] (s a list of K ints).
    """

    def __init__(self, env_fns: list):
        self.envs = gym.vector.SyncVectorEnv(env_fns, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        self.observation_space = self.envs.observation_space
        self.action_space = self.envs.action_space
        self._zeros = np.zeros(self.observation_space.shape, self.observation_space.dtype)

    def reset(self, *, seed=None, options=None):
        obs, _ = self.envs.reset(seed=seed, options=options)
        return obs, {}

    def step(self, action):
        obs, reward, terminated, truncated, info = self.envs.step(action)
        done = np.asarray(terminated, bool) | np.asarray(truncated, bool)
        if not done.any():
            return obs, reward, terminated, truncated, {}
        final = self._zeros.copy()
        for k in np.flatnonzero(done):
            final[k] = info["final_obs"][k]
        return obs, reward, terminated, truncated, {_FINAL_OBS: final, _FINISHED: done}

    def close(self):
        self.envs.close()


class WorkerVectorEnv(gym.vector.VectorEnv):
    """The B envs of `env_fns` (callables that each return one gymnasium env, all of the same spaces; picklable
    by reference, as `functools.partial(make_env, env_id)` is) in `num_workers` worker processes of B /
    `num_workers` envs each (None: `worker_count`).

    The same interface as the other backends: reset(seed) -> (obs [B, *obs_shape], info); step(actions
    [B, *action_shape]) -> (obs [B, *obs_shape], reward float64 [B], terminated bool [B], truncated bool [B],
    info), finished envs reset in the same step with their last observation in info["final_obs"] (object array,
    set where info["_final_obs"]). Env i is env i % K of worker i // K; reset(seed=s) gives env i the seed s + i,
    or s[i] for a list, as gymnasium's vector envs do.

    Raises (constructor):
        ValueError: `num_workers` does not divide `num_envs`.
    """

    metadata = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}

    def __init__(self, env_fns: list, num_workers: int | None = None):
        num_envs = len(env_fns)
        num_workers = worker_count(num_envs) if num_workers is None else num_workers
        if num_workers < 1 or num_envs % num_workers:
            raise ValueError(
                f"{num_workers} env workers cannot share {num_envs} envs evenly: give a number of workers that "
                f"divides the envs per actor ({num_envs})."
            )
        self.per_worker = num_envs // num_workers
        self.num_workers = num_workers
        one = env_fns[0]()  # the single spaces, as the env defines them (a Discrete's start included)
        try:
            self.single_observation_space, self.single_action_space = one.observation_space, one.action_space
        finally:
            one.close()
        self._pool = gym.vector.AsyncVectorEnv(
            [
                functools.partial(EnvGroup, env_fns[w * self.per_worker : (w + 1) * self.per_worker])
                for w in range(num_workers)
            ],
            shared_memory=True,
            copy=True,  # step and reset return copies: the shared buffer is overwritten by the next step
            context="spawn",
            autoreset_mode=gym.vector.AutoresetMode.DISABLED,  # each EnvGroup resets its own envs
        )
        self.num_envs = num_envs
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)

    def _flat(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x).reshape(self.num_envs, *np.shape(x)[2:])

    def reset(self, *, seed=None, options=None):
        """Resets all envs. `seed`: None, int (env i gets seed + i) or a list of B ints."""
        k = self.per_worker
        if seed is not None:
            seeds = [int(seed) + i for i in range(self.num_envs)] if np.ndim(seed) == 0 else [int(x) for x in seed]
            if len(seeds) != self.num_envs:
                raise ValueError(f"expected {self.num_envs} seeds, got {len(seeds)}: give one seed per env, or one int")
            seed = [seeds[w * k : (w + 1) * k] for w in range(self.num_workers)]
        obs, _ = self._pool.reset(seed=seed, options=options)
        return self._flat(obs), {}

    def step(self, actions):
        """Steps all envs, each worker its K in a row, the workers in parallel (see the class doc)."""
        actions = np.asarray(actions)
        if len(actions) != self.num_envs:
            raise ValueError(f"expected actions for {self.num_envs} envs, got {len(actions)} (shape {actions.shape})")
        actions = actions.reshape(self.num_workers, self.per_worker, *actions.shape[1:])
        obs, reward, terminated, truncated, info = self._pool.step(actions)
        obs = self._flat(obs)  # a copy of the shared buffer (copy=True)
        out = {}
        if _FINISHED in info:
            finished = self._flat(info[_FINISHED]).astype(bool)
            final_obs = self._flat(info[_FINAL_OBS])
            final = np.full(self.num_envs, None, dtype=object)
            for i in np.flatnonzero(finished):
                final[i] = final_obs[i]
            out = dict(final_obs=final, _final_obs=finished)
        return obs, self._flat(reward), self._flat(terminated).astype(bool), self._flat(truncated).astype(bool), out

    def close_extras(self, **kwargs) -> None:
        self._pool.close(**kwargs)
