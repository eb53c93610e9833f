"""The actor side: batched envs, the actor process, the writers' shared machinery."""

# The env backends an actor can step its envs with (`rlfleet.actors.envs.make_batched_env`), defined here so that
# the CLI can offer them without importing the env libraries.
ENV_BACKENDS = ("sync", "workers", "envpool", "async", "ale")

# An env id that carries constructor arguments (`--env-kwargs`): ID?{"key": value}
# (`rlfleet.actors.envs.env_with_kwargs`).
ENV_KWARGS_MARK = "?"


def gym_id(env_id: str) -> str:
    """The gymnasium id of an env id that may carry constructor arguments: "Corridor-v0?{...}" -> "Corridor-v0"."""
    return env_id.partition(ENV_KWARGS_MARK)[0]
