"""The env vocabulary: env ids and their constructor arguments, `EnvSpec`, making single and batched envs on each
backend (in process, worker processes, envpool, ale-py's Atari vector env), rendering. The actors, the learner's
evaluations and the algorithms all build their envs here; it imports no other folder of rlfleet but the ground
floor."""

# The env backends an actor can step its envs with (`rlfleet.envs.core.make_batched_env`), defined here so that
# the CLI can offer them without importing the env libraries.
ENV_BACKENDS = ("sync", "workers", "envpool", "async", "ale")

# Default of --env-timeout: seconds one env call (reset, step) may take before it is reported as hung and
# interrupted (`rlfleet.envs.watch.EnvWatch`).
ENV_TIMEOUT_S = 300.0

# An env id that carries constructor arguments (`--env-kwargs`): ID?{"key": value}
# (`rlfleet.envs.core.env_with_kwargs`).
ENV_KWARGS_MARK = "?"


def gym_id(env_id: str) -> str:
    """The gymnasium id of an env id that may carry constructor arguments: "Corridor-v0?{...}" -> "Corridor-v0"."""
    return env_id.partition(ENV_KWARGS_MARK)[0]
