"""Services start in any order: a learner started before its settings file and its replay server answers status
while it waits (phase, what it waits for), trains once they are there, and gives up after --start-timeout with
a message that names what never came. Real processes on loopback ports."""

import json
import signal
import time

import pytest
from helpers import rlfleet, status_or_none, wait_for

from rlfleet.deploy.status import check_health

SETTINGS = ("--algo", "dqn", "--env", "CartPole-v1")


@pytest.mark.slow
def test_learner_and_actor_started_before_the_replay_server_train_to_the_end(procs, free_port, tmp_path):
    replay_port, learner_port = free_port(), free_port()
    settings = tmp_path / "run" / "settings.json"
    learner_address, replay_address = f"127.0.0.1:{learner_port}", f"127.0.0.1:{replay_port}"
    actor = procs.start("actor", "actor", "--learner", learner_address, "--connect-timeout", 300)
    learner = procs.start(
        "learner", "learner", "--run-config", settings, "--replay", replay_address, "--logdir", tmp_path / "run",
        "--port", learner_port, "--total-steps", 2000, "--start-timeout", 300,
    )  # fmt: skip
    st = wait_for(
        lambda: status_or_none(learner_address, ready=False), 60, "the waiting learner's status", [learner, actor]
    )
    assert (st["phase"], st["waiting_for"], st["algo"]) == ("waiting_for_settings", str(settings), ""), st
    ok, message = check_health(learner=learner_address)
    assert not ok and "NOT_SERVING" in message  # not ready for its actors yet
    wait_for(lambda: "waiting for the run's settings" in learner.output(), 30, "the learner's wait line", [learner])

    written = rlfleet("settings", *SETTINGS, "--out", settings, timeout=120)
    assert written.returncode == 0, written.stderr
    st = wait_for(
        lambda: (s := status_or_none(learner_address, ready=False)) and s["phase"] == "waiting_for_replay" and s,
        120,
        "the learner waiting for the replay server",
        [learner, actor],
    )
    assert (st["waiting_for"], st["algo"], st["env_id"]) == (replay_address, "dqn", "CartPole-v1"), st
    assert st["actors"] == []  # the actor's registration waits until the learner serves
    wait_for(lambda: "waiting for the replay server" in learner.output(), 30, "the replay wait line", [learner])
    assert not check_health(learner=learner_address)[0]

    replay = procs.start(
        "replay", "replay", "--run-config", settings, "--port", replay_port, "--learner", learner_address
    )
    assert learner.proc.wait(timeout=300) == 0, learner.output()[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["completed"] and summary["env_steps"] >= 2000, summary
    assert actor.proc.wait(timeout=60) == 0, actor.output()[-3000:]
    assert replay.proc.wait(timeout=60) == 0, replay.output()[-3000:]


@pytest.mark.slow
def test_a_learner_whose_settings_never_come_gives_up_and_says_what_it_waited_for(tmp_path, free_port):
    settings = tmp_path / "nowhere" / "settings.json"
    start = time.monotonic()
    res = rlfleet(
        "learner", "--run-config", settings, "--replay", f"127.0.0.1:{free_port()}", "--logdir", tmp_path / "run",
        "--start-timeout", 6, timeout=120,
    )  # fmt: skip
    assert res.returncode == 2, res.stdout + res.stderr
    assert time.monotonic() - start < 60
    assert f"--run-config {settings} did not appear within 6 s (--start-timeout)" in res.stderr
    assert f"INFO waiting for the run's settings {settings}" in res.stderr
    assert not (tmp_path / "run").exists()  # nothing was written


@pytest.mark.slow
def test_a_learner_whose_replay_server_never_answers_gives_up_naming_it(tmp_path, free_port):
    settings = tmp_path / "settings.json"
    assert rlfleet("settings", *SETTINGS, "--out", settings, timeout=120).returncode == 0
    replay_address = f"127.0.0.1:{free_port()}"
    res = rlfleet(
        "learner", "--run-config", settings, "--replay", replay_address, "--logdir", tmp_path / "run",
        "--start-timeout", 8, timeout=180,
    )  # fmt: skip
    assert res.returncode == 2, res.stdout + res.stderr
    said = f"the replay server {replay_address} did not answer within the learner's --start-timeout of 8 s"
    assert said in res.stderr, res.stderr
    assert not (tmp_path / "run" / "summary.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize("phase", ["waiting_for_settings", "starting", "waiting_for_replay"])
def test_a_stop_before_the_learner_serves_ends_it_with_the_stopped_status(procs, tmp_path, free_port, phase):
    """SIGTERM while it waits for its settings, while it is built (TensorFlow, the networks) once they came, or
    while it waits for the replay server: exit status --exit-code-if-stopped, and no summary."""
    settings = tmp_path / "settings.json"
    if phase == "waiting_for_replay":
        assert rlfleet("settings", *SETTINGS, "--out", settings, timeout=120).returncode == 0
    learner_port = free_port()
    learner = procs.start(
        "learner", "learner", "--run-config", settings, "--replay", f"127.0.0.1:{free_port()}",
        "--logdir", tmp_path / "run", "--port", learner_port, "--exit-code-if-stopped", 3,
    )  # fmt: skip
    address = f"127.0.0.1:{learner_port}"
    first = "waiting_for_settings" if phase == "starting" else phase
    wait_for(lambda: (s := status_or_none(address, ready=False)) and s["phase"] == first, 120, first, [learner])
    if phase == "starting":
        assert rlfleet("settings", *SETTINGS, "--out", settings, timeout=120).returncode == 0
        seen = []
        while learner.proc.poll() is None and not seen:  # TensorFlow's import alone takes seconds
            st = status_or_none(address, ready=False)
            seen += [st] if st and st["phase"] not in ("waiting_for_settings",) else []
        assert seen and seen[0]["phase"] == "starting", seen
    learner.proc.send_signal(signal.SIGTERM)
    assert learner.proc.wait(timeout=60) == 3, learner.output()
    said = {
        "waiting_for_settings": "stopped while waiting for the run's settings",
        "starting": "stopped before it served",
        "waiting_for_replay": "stopped while waiting for the replay server",
    }[phase]
    assert said in learner.output()
    assert not (tmp_path / "run" / "summary.json").exists()


@pytest.mark.slow
def test_an_actor_held_by_a_learner_that_gave_up_registers_with_the_next_one(procs, tmp_path, free_port):
    """The actor's registration waits while the learner starts; a learner that gives up (no settings in time)
    ends it with ABORTED, and the actor registers with the learner started next on the same address."""
    learner_port, replay_port = free_port(), free_port()
    address = f"127.0.0.1:{learner_port}"
    settings = tmp_path / "settings.json"
    first = procs.start(
        "learner1", "learner", "--run-config", settings, "--replay", f"127.0.0.1:{replay_port}",
        "--logdir", tmp_path / "run", "--port", learner_port, "--start-timeout", 15,
    )  # fmt: skip
    wait_for(lambda: status_or_none(address, ready=False), 60, "the first learner", [first])
    actor = procs.start("actor", "actor", "--learner", address, "--connect-timeout", 300)
    assert first.proc.wait(timeout=120) == 2, first.output()
    wait_for(lambda: "registering again" in actor.output(), 60, "the actor's retry", [actor])
    procs.start("replay", "replay", *SETTINGS, "--settings-out", settings, "--port", replay_port)
    second = procs.start(
        "learner2", "learner", "--run-config", settings, "--replay", f"127.0.0.1:{replay_port}",
        "--logdir", tmp_path / "run", "--port", learner_port,
    )  # fmt: skip
    st = wait_for(
        lambda: (s := status_or_none(address)) and s["actors"] and s["env_steps"] > 0 and s, 240, "the actor", [second]
    )
    assert len(st["actors"]) == 1 and actor.proc.poll() is None
