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
    st = wait_for(lambda: status_or_none(learner_address), 60, "the waiting learner's status", [learner, actor])
    assert (st["phase"], st["waiting_for"], st["algo"]) == ("waiting_for_settings", str(settings), ""), st
    ok, message = check_health(learner=learner_address)
    assert not ok and "NOT_SERVING" in message  # not ready for its actors yet
    wait_for(lambda: "waiting for the run's settings" in learner.output(), 30, "the learner's wait line", [learner])

    written = rlfleet("settings", *SETTINGS, "--out", settings, timeout=120)
    assert written.returncode == 0, written.stderr
    st = wait_for(
        lambda: (s := status_or_none(learner_address)) and s["phase"] == "waiting_for_replay" and s,
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
    assert f"waiting for the run's settings {settings}" in res.stdout
    assert not (tmp_path / "run").exists()  # nothing was written


def test_a_learner_whose_replay_server_never_answers_gives_up_naming_it(tmp_path, free_port):
    settings = tmp_path / "settings.json"
    assert rlfleet("settings", *SETTINGS, "--out", settings, timeout=120).returncode == 0
    replay_address = f"127.0.0.1:{free_port()}"
    res = rlfleet(
        "learner", "--run-config", settings, "--replay", replay_address, "--logdir", tmp_path / "run",
        "--start-timeout", 8, timeout=180,
    )  # fmt: skip
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"the replay server {replay_address} did not answer within" in res.stderr
    assert "--start-timeout" in res.stderr
    assert not (tmp_path / "run" / "summary.json").exists()


@pytest.mark.parametrize("waits_for", ["settings", "replay"])
def test_a_stop_while_waiting_ends_the_learner_with_the_stopped_status(procs, tmp_path, free_port, waits_for):
    settings = tmp_path / "settings.json"
    if waits_for == "replay":
        assert rlfleet("settings", *SETTINGS, "--out", settings, timeout=120).returncode == 0
    learner_port = free_port()
    learner = procs.start(
        "learner", "learner", "--run-config", settings, "--replay", f"127.0.0.1:{free_port()}",
        "--logdir", tmp_path / "run", "--port", learner_port, "--exit-code-if-stopped", 3,
    )  # fmt: skip
    phase = f"waiting_for_{waits_for}"
    wait_for(lambda: (s := status_or_none(f"127.0.0.1:{learner_port}")) and s["phase"] == phase, 120, phase, [learner])
    learner.proc.send_signal(signal.SIGTERM)
    assert learner.proc.wait(timeout=30) == 3, learner.output()
    what = "the run's settings" if waits_for == "settings" else "the replay server"
    assert f"stopped while waiting for {what}" in learner.output()
    assert not (tmp_path / "run" / "summary.json").exists()
