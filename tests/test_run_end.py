"""The run's end when the first process to exit stops the others (docker-compose --exit-code-from learner): the
replay server started with --learner and the actors that have left wait until the finished learner's status lists
no other actor, so that none of them exits while another actor is still leaving; and they stop by themselves once
the learner is gone. Real processes on loopback ports."""

import signal
import subprocess
import time

import pytest
from helpers import status_or_none, wait_for

from rlfleet.replay.server import RUN_OVER_POLL_S

pytestmark = pytest.mark.slow

SETTINGS = ("--algo", "dqn", "--env", "CartPole-v1", "--set", "min_replay_size=300")
HELD_S = 8  # seconds the finished run is watched while one actor cannot leave


def _finished_with_an_actor_held(procs, free_port, tmp_path):
    """A run of two actors, one of them stopped (SIGSTOP) while it trains: it stays in the status list (no
    heartbeat, no leaving) while the other finishes the run. Returns (replay, learner, first, held, address) once
    the learner's status says finished and lists only the held actor."""
    replay_port, learner_port = free_port(), free_port()
    address = f"127.0.0.1:{learner_port}"
    replay = procs.start("replay", "replay", *SETTINGS, "--port", replay_port, "--learner", address)
    learner = procs.start(
        "learner", "learner", *SETTINGS, "--replay", f"127.0.0.1:{replay_port}", "--logdir", tmp_path / "run",
        "--port", learner_port, "--total-steps", 6000, "--actor-timeout", 600, "--linger", 300,
    )  # fmt: skip
    wait_for(lambda: status_or_none(address), 120, "the learner", [replay, learner])
    first = procs.start("actor-first", "actor", "--learner", address)
    held = procs.start("actor-held", "actor", "--learner", address)
    wait_for(
        lambda: (st := status_or_none(address)) is not None and len(st["actors"]) == 2,
        180,
        "both actors registered",
        [replay, learner, first, held],
    )
    held.proc.send_signal(signal.SIGSTOP)
    wait_for(
        lambda: (s := status_or_none(address, ready=False)) is not None and s["finished"] and len(s["actors"]) == 1,
        300,
        "the run's end with only the held actor listed",
        [replay, learner, first],
    )
    return replay, learner, first, held, address


def test_replay_and_actors_wait_for_the_last_actor_to_leave(procs, free_port, tmp_path):
    replay, learner, first, held, address = _finished_with_an_actor_held(procs, free_port, tmp_path)
    try:
        wait_for(lambda: "stopped after" in first.output(), 60, "the first actor's stop", [first])
        end = time.monotonic() + HELD_S
        while time.monotonic() < end:
            assert replay.proc.poll() is None, f"the replay server stopped before every actor left:\n{replay.output()}"
            assert first.proc.poll() is None, f"an actor exited before every actor left:\n{first.output()}"
            assert learner.proc.poll() is None, learner.output()[-3000:]
            time.sleep(0.5)
    finally:
        held.proc.send_signal(signal.SIGCONT)
    # The held actor hears the run is over, leaves, and the others end by themselves.
    for name, p in dict(held=held, first=first, replay=replay, learner=learner).items():
        assert p.proc.wait(timeout=120) == 0, f"{name}:\n{p.output()[-3000:]}"
    assert "stopped after" in held.output()
    assert "is over (phase done); stopping" in replay.output()


def _exit_code(p, timeout: float):
    """The exit status of the process `p`; a process still running after `timeout` seconds fails the test with
    its output."""
    try:
        return p.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"still running after {timeout:.0f} s:\n{p.output()[-3000:]}") from None


def test_once_the_finished_learner_is_gone_the_replay_server_and_the_actors_stop(procs, free_port, tmp_path):
    replay, learner, first, held, address = _finished_with_an_actor_held(procs, free_port, tmp_path)
    try:
        # The replay server takes a learner it cannot reach for one that is starting unless it has seen it say
        # finished: it asks every RUN_OVER_POLL_S seconds, so it is given two asks before the learner goes.
        time.sleep(2 * RUN_OVER_POLL_S + 0.5)
        assert status_or_none(address, ready=False)["finished"]
        learner.proc.kill()  # it said finished, then went away with the held actor still listed
        learner.proc.wait(timeout=30)
        assert _exit_code(replay, 60) == 0, replay.output()[-3000:]
        assert "and it has exited; stopping" in replay.output()
        assert _exit_code(first, 60) == 0, first.output()[-3000:]
    finally:
        held.proc.send_signal(signal.SIGCONT)
