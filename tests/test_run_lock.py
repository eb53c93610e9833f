"""One writer per run directory: a second `up`, learner or replay server on a directory that a running process
writes is refused (exit 2) with the holder's role, pid and host; the lock goes with the process that held it,
however it ended. Real processes; the lock is the kernel's (flock)."""

import fcntl
import json
import os
import signal
import socket

import psutil
import pytest
from helpers import Proc, rlfleet, wait_for

PENDULUM = ("--algo", "ppo", "--env", "Pendulum-v1")


def _lock_is_free(path) -> bool:
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


@pytest.mark.slow
def test_a_second_writer_of_a_running_run_is_refused_and_a_crash_frees_the_directory(tmp_path):
    """A second `up` and a learner of their own on a directory a running `up` writes are refused naming it; once
    that `up` is killed, a resume waits for its stopping children and goes on."""
    run = tmp_path / "run"
    first = Proc(tmp_path, "up", "up", *PENDULUM, "--total-steps", 10**7, "--logdir", run)
    try:
        wait_for(lambda: "learner at" in first.output(), 240, "the first run's learner", [first])
        holder = json.loads((run / ".rlfleet-lock").read_text())
        assert holder["role"] == "up" and holder["pid"] == first.proc.pid and holder["host"] == socket.gethostname()
        said = "is being written by `rlfleet up"
        who = f"(up, pid {first.proc.pid} on host {socket.gethostname()}"
        # The same command again (a second terminal, a requeued job), and a learner of its own on the directory.
        again = rlfleet("up", *PENDULUM, "--total-steps", 10**7, "--logdir", run, timeout=120)
        learner = rlfleet("learner", *PENDULUM, "--replay", "127.0.0.1:1", "--logdir", run, timeout=120)
        # A resume of it, through another name, before it wrote a checkpoint: refused for the writer, not for the
        # missing checkpoint.
        (tmp_path / "link").symlink_to(run)
        resumed = rlfleet("up", "--resume", tmp_path / "link", timeout=120)
        for out in (again, learner, resumed):
            assert out.returncode == 2, out.stdout + out.stderr
            assert said in out.stderr and who in out.stderr and f"kill {first.proc.pid}" in out.stderr, out.stderr
            assert ".rlfleet-lock releases it" not in out.stderr  # its host is this one: never remove the lock
        assert first.proc.poll() is None  # the run goes on
    finally:
        children = psutil.Process(first.proc.pid).children() if first.proc.poll() is None else []
        first.stop(signal.SIGKILL)  # a crash: no clean stop; its children stop on their parent's death
    # At once: the learner up started still holds up's lock while it checkpoints and exits; a resume waits for it
    # (the lock's holder has exited) instead of being refused, and runs (here up to the wait for a replay server).
    out = rlfleet("learner", *PENDULUM, "--replay", "127.0.0.1:1", "--resume", run, "--start-timeout", "2",
                  timeout=300)  # fmt: skip
    assert out.returncode == 2 and "did not answer" in out.stderr and "being written" not in out.stderr, out.stderr
    assert _lock_is_free(run / ".rlfleet-lock")
    _, alive = psutil.wait_procs(children, timeout=60)
    assert not alive, alive  # nothing the killed run started outlives it


def test_a_second_replay_server_on_a_checkpoint_folder_is_refused(tmp_path):
    """Two replay servers on one --checkpoint-dir would overwrite each other's checkpoints: the second is refused."""
    folder = tmp_path / "replay"
    args = ("replay", "--algo", "dqn", "--env", "CartPole-v1", "--port", 0, "--checkpoint-dir", folder)
    first = Proc(tmp_path, "replay", *args)
    try:
        wait_for(lambda: "serving on port" in first.output(), 120, "the first replay server", [first])
        out = rlfleet(*args, timeout=120)
        assert out.returncode == 2, out.stdout + out.stderr
        assert f"{folder} is being written by" in out.stderr and f"(replay, pid {first.proc.pid}" in out.stderr
    finally:
        assert first.stop() == 0  # the first one stops cleanly, its checkpoint written
