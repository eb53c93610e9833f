"""Faults, nothing lost: kill -9 of an actor, of the learner and of the replay server.

Each test runs the services as separate processes (`rlfleet replay`, `rlfleet
learner`, `rlfleet actor`, as docker-compose runs them) on loopback ports, with
DQN on CartPole-v1, and asserts that counters and learning continue from where
they were rather than restart.
"""

import json
import math
import os
import signal

import pytest
from helpers import status_or_none, wait_for

from rlfleet.common.files import read_json_lines
from rlfleet.deploy.status import format_status
from rlfleet.replay.checkpoints import latest_checkpoint

pytestmark = pytest.mark.slow

DQN = ("--algo", "dqn", "--env", "CartPole-v1", "--set", "min_replay_size=300")


def _table(st):
    """The DQN table's status row (zeros while status has not read the replay server yet)."""
    return next((t for t in st["replay"] if t["table"] == "dqn_replay"), dict(size=0, max_size=0, inserts=0, samples=0))


def _server_info(address):
    import reverb

    try:
        return reverb.Client(address).server_info(timeout=2)["dqn_replay"]
    except Exception:
        return None


def _cluster(procs, tmp_path, free_port, actors=2, replay_extra=(), learner_extra=()):
    run = tmp_path / "run [1]*? ü"  # characters TensorFlow and Reverb read as file-name patterns
    replay_port, learner_port = free_port(), free_port()
    replay_args = ("replay", *DQN, "--port", replay_port, "--checkpoint-dir", run / "replay", *replay_extra)
    replay = procs.start("replay", *replay_args)
    learner_args = (
        "learner",
        *DQN,
        "--replay",
        f"127.0.0.1:{replay_port}",
        "--logdir",
        run,
        "--port",
        learner_port,
        "--total-steps",
        10**7,
        "--checkpoint-interval",
        2,
        "--report-interval",
        1,
        "--actor-timeout",
        3,
        *learner_extra,
    )
    learner = procs.start("learner", *learner_args)
    address = f"127.0.0.1:{learner_port}"
    wait_for(lambda: status_or_none(address), 180, "the learner to serve", [replay, learner])
    started = [procs.start(f"actor-{i}", "actor", "--learner", address) for i in range(actors)]
    return dict(
        run=run,
        replay=replay,
        learner=learner,
        actors=started,
        address=address,
        replay_args=replay_args,
        learner_args=learner_args,
    )


def test_actor_kill9_training_continues(procs, tmp_path, free_port):
    c = _cluster(procs, tmp_path, free_port)
    st = wait_for(
        lambda: (s := status_or_none(c["address"])) and len(s["actors"]) == 2 and s["learner_steps"] > 50 and s,
        240,
        "two actors and learning",
        [c["learner"], *c["actors"]],
    )
    # A paused actor (SIGSTOP: a frozen host, a network partition) leaves the list after --actor-timeout
    # and rejoins with its id when it resumes; none of its env steps is lost from the count.
    c["actors"][1].proc.send_signal(signal.SIGSTOP)
    wait_for(
        lambda: (s := status_or_none(c["address"])) and len(s["actors"]) == 1 and s,
        60,
        "the paused actor to leave the status list",
        [c["learner"], c["actors"][0]],
    )
    c["actors"][1].proc.send_signal(signal.SIGCONT)
    back = wait_for(
        lambda: (s := status_or_none(c["address"])) and len(s["actors"]) == 2 and s,
        60,
        "the paused actor to rejoin",
        [c["learner"], *c["actors"]],
    )
    assert sorted(a["actor_id"] for a in back["actors"]) == [0, 1]
    assert back["env_steps"] >= sum(a["env_steps"] for a in back["actors"]), back
    c["actors"][0].proc.send_signal(signal.SIGKILL)
    c["actors"][0].proc.wait()
    # The dead actor leaves the status list after --actor-timeout; the other one goes on.
    after = wait_for(
        lambda: (s := status_or_none(c["address"])) and len(s["actors"]) == 1 and s,
        60,
        "the killed actor to leave the status list",
        [c["learner"], c["actors"][1]],
    )
    assert after["env_steps"] >= st["env_steps"]
    later = wait_for(
        lambda: (
            (s := status_or_none(c["address"]))
            and s["env_steps"] > after["env_steps"] + 500
            and s["learner_steps"] > after["learner_steps"] + 50
            and s
        ),
        120,
        "collection and learning to continue",
        [c["learner"], c["actors"][1]],
    )
    assert later["actors"][0]["policy_version"] > st["policy_version"]


def test_learner_kill9_resume_actors_reconnect(procs, tmp_path, free_port):
    # An evaluation every 2 policy versions (100 learner steps) instead of 10: several after the restart.
    c = _cluster(procs, tmp_path, free_port, learner_extra=("--set", "eval_every_updates=2"))
    # A policy clearly better than random (CartPole: ~22) before the crash.
    before = wait_for(
        lambda: (s := status_or_none(c["address"])) and s["eval_return_mean"] >= 150 and len(s["actors"]) == 2 and s,
        240,
        "an evaluation return >= 150",
        [c["learner"], *c["actors"]],
    )
    ckpt_index = c["run"] / "checkpoints" / "checkpoint"
    # Evaluations can reach the return before the first save has ended.
    wait_for(ckpt_index.exists, 60, "a first checkpoint", [c["learner"]])
    # The index is rewritten when a save ends; a save that was under way at `before` took its counters
    # earlier, so wait for the index to change twice.
    for _ in range(2):
        written = os.path.getmtime(ckpt_index)
        wait_for(
            lambda written=written: os.path.getmtime(ckpt_index) > written,
            30,
            "a checkpoint after that point",
            [c["learner"]],
        )
    c["learner"].proc.send_signal(signal.SIGKILL)
    c["learner"].proc.wait()
    # The newest checkpoint's record keeps the time its run spent evaluating so far.
    records = sorted((c["run"] / "checkpoints").glob("ckpt-*.progress.json"), key=lambda p: int(p.name[5:-14]))
    restored_eval_s = json.loads(records[-1].read_text())["evaluation_seconds"]
    assert restored_eval_s > 0, records[-1].read_text()
    # The same command with --resume RUN in place of --logdir RUN (it continues in the resumed directory).
    args = list(c["learner_args"])
    del args[args.index("--logdir") : args.index("--logdir") + 2]
    learner = procs.start("learner-restarted", *args, "--resume", c["run"])
    first = wait_for(lambda: status_or_none(c["address"]), 180, "the restarted learner", [learner, c["replay"]])
    # Counters continue from the checkpoint (taken after `before`), not from zero.
    assert first["learner_steps"] >= before["learner_steps"], (first, before)
    assert first["env_steps"] >= before["env_steps"]
    assert first["policy_version"] >= before["policy_version"]
    # The same actor processes (not restarted) rejoin by themselves and act with the new learner's weights.
    assert all(a.proc.poll() is None for a in c["actors"])
    evaluations = []  # every evaluation return the restarted learner reports while we wait

    def rejoined():
        s = status_or_none(c["address"])
        if s is None:
            return None
        if not math.isnan(s["eval_return_mean"]):
            evaluations.append(s["eval_return_mean"])
        return (
            len(s["actors"]) == 2
            and min(a["policy_version"] for a in s["actors"]) > first["policy_version"]
            and s["env_steps"] > first["env_steps"]
            and s["learner_steps"] > first["learner_steps"] + 500  # 5 evaluations (one per 100 learner steps)
            and evaluations
            and s
        )

    what = "actors to rejoin, learning and collection to continue over 500 learner steps, and an evaluation"
    later = wait_for(rejoined, 240, what, [learner, *c["actors"]])
    # Returns continue from the restored network rather than from a random one (a random network's greedy
    # return is about 10-40). DQN's return on CartPole swings by tens between evaluations even without a
    # restart (seen: 150 -> 95; in CI 149, 171, 143 before the kill, then 88.7 at the one evaluation this test
    # then waited for), so the best evaluation over the 500 learner steps after the restart is compared.
    assert max(evaluations) >= 100, (evaluations, later)

    # The resumed learner counts its evaluations' time on from the checkpoint's, in its metrics rows (the row
    # after an evaluation is written at the next report interval: waited for).
    def last_row():
        rows, _ = read_json_lines(str(c["run"] / "metrics.jsonl"))  # a row being written is skipped
        return rows[-1] if rows and rows[-1]["evaluation_seconds"] > restored_eval_s else None

    row = wait_for(last_row, 60, "a metrics row with the resumed evaluations' time", [learner])
    assert row["evaluation_seconds"] < row["wall_seconds"], row
    assert sorted(a["actor_id"] for a in later["actors"]) == [0, 1]
    # Nothing the surviving actors collected is lost from the count: the checkpoint recorded where each
    # actor stood, so the steps between that checkpoint and the rejoin (the crash window) are counted too.
    assert later["env_steps"] >= sum(a["env_steps"] for a in later["actors"]), later
    # A new actor does not take the id of one that has not rejoined yet.
    newcomer = procs.start("actor-new", "actor", "--learner", c["address"])
    joined = wait_for(
        lambda: (s := status_or_none(c["address"])) and len(s["actors"]) == 3 and s,
        120,
        "a third actor",
        [learner, newcomer],
    )
    assert sorted(a["actor_id"] for a in joined["actors"]) == [0, 1, 2]


def test_replay_kill9_restores_checkpoint(procs, tmp_path, free_port):
    c = _cluster(procs, tmp_path, free_port, replay_extra=("--checkpoint-interval", 3))
    before = wait_for(
        lambda: (s := status_or_none(c["address"])) and s["learner_steps"] > 100 and _table(s)["size"] > 1000 and s,
        240,
        "a filled replay table",
        [c["learner"], c["replay"], *c["actors"]],
    )
    checkpoints = lambda: c["replay"].output().count(" INFO checkpoint ")
    # A checkpoint under way when `before` was read (status reads replay counters up to a second late) may
    # hold fewer items: wait for the second one to finish.
    seen = checkpoints()
    wait_for(lambda: checkpoints() > seen + 1, 30, "a replay checkpoint after that point", [c["replay"]])
    c["replay"].proc.send_signal(signal.SIGKILL)
    c["replay"].proc.wait()
    wait_for(
        lambda: (s := status_or_none(c["address"])) and "replay server does not answer" in format_status(s),
        30,
        "status to report the replay outage",
        [c["learner"]],
    )
    replay = procs.start("replay-restarted", *c["replay_args"])
    replay_address = f"127.0.0.1:{c['replay_args'][c['replay_args'].index('--port') + 1]}"
    info = wait_for(lambda: _server_info(replay_address), 120, "the restarted replay", [replay])
    assert info.current_size >= _table(before)["size"], "the table did not come back from its checkpoint"
    assert " NOTICE restoring " in replay.output(), replay.output()[-2000:]
    restored = wait_for(lambda: status_or_none(c["address"]), 60, "status after the restart", [replay, c["learner"]])
    # Learner and actors (none restarted) reconnect: new items arrive and learning goes on.
    later = wait_for(
        lambda: (
            (s := status_or_none(c["address"]))
            and _table(s)["inserts"] > _table(restored)["inserts"] + 500
            and s["learner_steps"] > restored["learner_steps"] + 100
            and s
        ),
        180,
        "inserts and learning after the restart",
        [replay, c["learner"], *c["actors"]],
    )
    assert later["env_steps"] > before["env_steps"]
    assert "is back" in c["actors"][0].output()
    # A clean stop (SIGTERM) writes a final checkpoint; a server whose tables did not change since its
    # latest checkpoint names that one instead of writing another.
    for p in c["actors"]:  # stopped before the run's end
        assert p.stop() == 3, p.output()[-2000:]
    assert c["learner"].stop() == 0, c["learner"].output()[-2000:]
    assert replay.stop() == 0
    latest = latest_checkpoint(str(c["run"] / "replay"))
    assert (
        f" INFO checkpoint {latest}" in replay.output()
        or f" INFO tables unchanged since checkpoint {latest}" in replay.output()
    ), replay.output()[-2000:]
    again = procs.start("replay-again", *c["replay_args"])
    wait_for(lambda: _server_info(replay_address), 120, "the replay server once more", [again])
    assert again.stop() == 0
    assert f"tables unchanged since checkpoint {latest}" in again.output(), again.output()[-2000:]


def test_checkpoint_replay_keeps_its_timeout_against_a_frozen_server(procs, tmp_path, free_port):
    import time

    from helpers import rlfleet

    from rlfleet.replay.checkpoints import ReplayCheckpointError, checkpoint_replay

    port = free_port()
    replay = procs.start("replay", "replay", *DQN, "--port", port, "--checkpoint-dir", tmp_path / "replay")
    wait_for(lambda: "serving on port" in replay.output(), 120, "the replay server", [replay])
    address = f"127.0.0.1:{port}"
    assert checkpoint_replay(address, 60, root=str(tmp_path / "replay")) == str(tmp_path / "replay" / "ckpt-1")
    replay.proc.send_signal(signal.SIGSTOP)  # accepts connections (the kernel does), answers nothing
    try:
        started = time.monotonic()
        try:
            checkpoint_replay(address, timeout_s=3)
            raise AssertionError("a frozen replay server wrote a checkpoint")
        except ReplayCheckpointError as e:
            assert "no answer within 3 s" in str(e), e
        assert time.monotonic() - started < 6
        out = rlfleet("replay-checkpoint", "--replay", address, "--timeout", "2", timeout=120)
        assert out.returncode == 2 and "no answer within 2 s" in out.stderr, out.stderr
    finally:
        replay.proc.send_signal(signal.SIGCONT)
