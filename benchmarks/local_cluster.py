"""Real `rlfleet replay` / `learner` / `actor` processes on loopback ports, for benchmarks."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time


class LocalCluster:
    """Context manager: starts a replay server and a learner (and actors on request); stops them all on exit.

    Args:
        common: arguments both `replay` and `learner` get (--algo, --env, --set ...).
        replay_args: extra `replay` arguments (e.g. --checkpoint-dir).
    Attributes:
        replay_address / learner_address: host:port; logdir: the learner's run directory;
        procs: the child processes, replay first.
    Raises:
        RuntimeError: the learner did not answer status within 120 s.
    """

    def __init__(self, common: list[str], replay_args: list[str] = ()):
        import portpicker

        # RLFLEET_PARENT_PID: the services get SIGTERM if the benchmark dies (`rlfleet.common.parent`).
        self.env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", RLFLEET_PARENT_PID=str(os.getpid()))
        rport, lport = portpicker.pick_unused_port(), portpicker.pick_unused_port()
        self.replay_address, self.learner_address = f"127.0.0.1:{rport}", f"127.0.0.1:{lport}"
        self.logdir = tempfile.mkdtemp(prefix="rlfleet-bench-")
        self.common, self.replay_args, self.lport, self.rport = common, list(replay_args), lport, rport
        self.procs: list[subprocess.Popen] = []

    def _start(self, args: list[str]) -> subprocess.Popen:
        p = subprocess.Popen(
            [sys.executable, "-m", "rlfleet.deploy.cli", *args],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.procs.append(p)
        return p

    def __enter__(self) -> "LocalCluster":
        from rlfleet.deploy.status import get_status

        self._start(["replay", *self.common, "--port", str(self.rport), *self.replay_args])
        self._start(
            [
                "learner",
                *self.common,
                "--replay",
                self.replay_address,
                "--logdir",
                self.logdir,
                "--port",
                str(self.lport),
            ]
        )
        from rlfleet.learner.status import STARTING_PHASES

        deadline = time.monotonic() + 120
        while True:
            try:
                if get_status(self.learner_address, 1)["phase"] not in STARTING_PHASES:
                    return self
            except Exception:
                pass
            if time.monotonic() > deadline:
                self.__exit__()
                raise RuntimeError("learner did not start")
            time.sleep(0.5)

    def add_actor(self, *args: str) -> subprocess.Popen:
        """Starts one `rlfleet actor` joining the learner."""
        return self._start(["actor", "--learner", self.learner_address, *args])

    def window(self, seconds: float, warmup: float, start_timeout: float = 300.0) -> tuple[dict, dict, float]:
        """Waits for the first replay insert and `warmup` s, then returns (status before, status after, seconds)
        around a `seconds` window.

        Raises:
            RuntimeError: a process of the cluster exited (e.g. an actor whose env backend does not fit the env),
                or no item reached the replay within `start_timeout` seconds.
        """
        from rlfleet.deploy.status import get_status

        deadline = time.monotonic() + start_timeout
        while get_status(self.learner_address, 2)["replay"][0]["inserts"] == 0:
            dead = [p.args[3] for p in self.procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(
                    f"the {dead[0]} process exited ({[p.returncode for p in self.procs if p.poll() is not None]})"
                    if dead
                    else f"no replay insert within {start_timeout:.0f}s"
                )
            time.sleep(0.5)
        time.sleep(warmup)
        s0, t0 = get_status(self.learner_address, 2), time.monotonic()
        time.sleep(seconds)
        return s0, get_status(self.learner_address, 2), time.monotonic() - t0

    def __exit__(self, *exc) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(self.logdir, ignore_errors=True)  # a throwaway run: only its rates are kept
