"""Helpers for tests that run rlfleet services as real processes on loopback ports.

Imported as `helpers` (pyproject.toml puts tests/ on sys.path); the pytest fixtures built on them are in
conftest.py.
"""

import os
import signal
import subprocess
import sys
import time
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The environment of every rlfleet process a test starts, read-only: a test that needs more variables passes
# its own copy, e.g. `env=dict(ENV, RLFLEET_TOKEN="s3cret")`. rlfleet.* resolves through the installed package.
ENV = types.MappingProxyType(dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))


def rlfleet(*args, env=ENV, **kwargs):
    """Runs `python -m rlfleet.deploy.cli ARGS` in environment `env` to completion; returns CompletedProcess."""
    return subprocess.run(
        [sys.executable, "-m", "rlfleet.deploy.cli", *map(str, args)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        **kwargs,
    )


class Proc:
    """A background rlfleet service process, in environment `env`, whose output goes to a log file."""

    def __init__(self, tmp_path, name, *args, env=ENV):
        self.log_path = tmp_path / f"{name}.log"
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rlfleet.deploy.cli", *map(str, args)],
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output(self):
        return self.log_path.read_text(errors="replace")

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def wait_for(predicate, timeout, what, procs=()):
    deadline = time.time() + timeout
    while time.time() < deadline:
        for p in procs:
            assert p.proc.poll() is None, f"{what}: a process died:\n{p.output()[-3000:]}"
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def status_or_none(address):
    """The learner's status at `address`, or None while it does not answer (for `wait_for`)."""
    from rlfleet.deploy.status import StatusError, get_status

    try:
        return get_status(address, 2)
    except StatusError:
        return None


def start_replay_and_learner(procs, free_port, settings, logdir, *learner_args):
    """Starts `rlfleet replay` and `rlfleet learner` (never-ending budget) with the same `settings` (--algo,
    --env, --set ...) on free loopback ports; returns (replay, learner, learner address). The caller waits
    for the learner; `learner_args` go to the learner only. The replay server's port is `replay.port`."""
    replay_port, learner_port = free_port(), free_port()
    replay = procs.start("replay", "replay", *settings, "--port", replay_port)
    replay.port = replay_port
    learner = procs.start(
        "learner",
        "learner",
        *settings,
        "--replay",
        f"127.0.0.1:{replay_port}",
        "--logdir",
        logdir,
        "--port",
        learner_port,
        "--total-steps",
        10**7,
        *learner_args,
    )
    return replay, learner, f"127.0.0.1:{learner_port}"
