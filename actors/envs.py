"""Environment specs and batched environments for actors and evaluation.

BatchPPO (Hafner et al. 2017, Sec. 2) steps each environment of a batch in its
own process so that stepping runs in parallel without GIL contention; the
default backend here is gymnasium's `AsyncVectorEnv` (one process per env,
observations returned through shared memory), which implements exactly that.
"""
from __future__ import annotations

import dataclasses

import gymnasium as gym
import numpy as np

BACKENDS = ("async", "sync")


class EnvError(ValueError):
    """An environment id or its spaces cannot be used for the requested algorithm."""


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """What the learner, the replay tables and the actors must agree on.

    Attributes:
        env_id: gymnasium id, e.g. "HalfCheetah-v5".
        obs_shape: observation shape (float32 after conversion).
        action_kind: "continuous" (Box) or "discrete".
        action_dim: Box: number of action dimensions; discrete: number of actions.
        action_low / action_high: Box bounds (float32 [action_dim]); empty for discrete.
        max_episode_steps: time limit of the registered env (None if unlimited).
    """
    env_id: str
    obs_shape: tuple
    action_kind: str
    action_dim: int
    action_low: tuple = ()
    action_high: tuple = ()
    max_episode_steps: int | None = None


def _make(env_id: str) -> gym.Env:
    try:
        return gym.make(env_id)
    except gym.error.Error as e:  # NameNotFound, VersionNotFound, DependencyNotInstalled...
        raise EnvError(
            f"unknown or unavailable environment id {env_id!r}: {e}. "
            "Use a gymnasium id such as HalfCheetah-v5 or InvertedPendulum-v5.") from e


def env_spec(env_id: str) -> EnvSpec:
    """Builds the env once and reads its spaces.

    Raises:
        EnvError: unknown id, or an observation space that is not a flat Box.
    """
    env = _make(env_id)
    try:
        obs, act = env.observation_space, env.action_space
        if not isinstance(obs, gym.spaces.Box) or len(obs.shape) != 1:
            raise EnvError(f"{env_id}: observation space {obs} is not a flat Box; "
                           "rlfleet's MLP policies need vector observations.")
        if isinstance(act, gym.spaces.Box):
            if len(act.shape) != 1 or not np.all(np.isfinite(act.low)) or not np.all(np.isfinite(act.high)):
                raise EnvError(f"{env_id}: action space {act} must be a bounded 1-D Box.")
            return EnvSpec(env_id, tuple(obs.shape), "continuous", int(act.shape[0]),
                           tuple(float(x) for x in act.low), tuple(float(x) for x in act.high),
                           env.spec.max_episode_steps if env.spec else None)
        if isinstance(act, gym.spaces.Discrete):
            return EnvSpec(env_id, tuple(obs.shape), "discrete", int(act.n),
                           max_episode_steps=env.spec.max_episode_steps if env.spec else None)
        raise EnvError(f"{env_id}: unsupported action space {act}.")
    finally:
        env.close()


def require_continuous(spec: EnvSpec, algo: str) -> None:
    """Raises EnvError when `algo` needs a continuous (Box) action space and `spec` is discrete."""
    if spec.action_kind != "continuous":
        raise EnvError(
            f"{spec.env_id} has a discrete action space ({spec.action_dim} actions), but "
            f"--algo {algo} (BatchPPO) needs continuous Box actions. Use a MuJoCo env such "
            "as HalfCheetah-v5, or --algo dqn for discrete actions.")


def make_batched_env(env_id: str, num_envs: int, backend: str = "async") -> gym.vector.VectorEnv:
    """Creates `num_envs` copies of `env_id` stepped as one batch.

    Observations come back as [num_envs, *obs_shape]; finished episodes are
    reset in the same step (gymnasium AutoresetMode.SAME_STEP), so the returned
    observation after a `done` is the first of the next episode.

    Args:
        backend: "async" (one process per env, shared memory: the BatchPPO
            layout) or "sync" (all envs in the calling process).
    Raises:
        EnvError: unknown backend or env id.
    """
    if backend not in BACKENDS:
        raise EnvError(f"unknown env backend {backend!r}; choose one of {BACKENDS}.")
    _make(env_id).close()  # fail fast here, not inside a worker process
    fns = [lambda: gym.make(env_id) for _ in range(num_envs)]
    mode = gym.vector.AutoresetMode.SAME_STEP
    if backend == "async":
        venv = gym.vector.AsyncVectorEnv(fns, shared_memory=True, context="spawn", autoreset_mode=mode)
    else:
        venv = gym.vector.SyncVectorEnv(fns, autoreset_mode=mode)
    return venv
