"""A user's own gymnasium env, as a package the tests put on PYTHONPATH: `--env tests_env_pkg.envs:Corridor-v0`."""
