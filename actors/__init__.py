"""The actor side: batched envs, the actor process, the writers' shared machinery."""

# The env backends an actor can step its envs with (`rlfleet.actors.envs.make_batched_env`), defined here so that
# the CLI can offer them without importing the env libraries.
ENV_BACKENDS = ("async", "sync", "envpool", "ale")
