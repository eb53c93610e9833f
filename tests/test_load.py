"""Many actors on one learner (real replay, learner and actor processes on loopback, plus 128 simulated actors
in one client process, each on its own connection): weight streams take no server thread, so status,
heartbeats and a new registration answer within a second, every simulated actor receives new policy
versions, the real actor's env steps keep being counted, and leaving actors drop out of status at once."""

import math
import signal
import subprocess
import sys
import time

import grpc
import pytest
from helpers import ENV, ROOT, start_replay_and_learner, status_or_none, wait_for

from rlfleet.deploy.status import get_status
from rlfleet.loadgen.simulated_actors import fan_out_seconds, read_stats
from rlfleet.proto import rlfleet_pb2, rlfleet_pb2_grpc

pytestmark = pytest.mark.slow

DQN = ("--algo", "dqn", "--env", "CartPole-v1", "--set", "min_replay_size=300")
SIMULATED = 128


def test_128_simulated_actors_leave_status_heartbeats_and_registration_prompt(procs, tmp_path, free_port):
    replay, learner, address = start_replay_and_learner(procs, free_port, DQN, tmp_path / "run")
    wait_for(lambda: status_or_none(address), 120, "the learner", [replay, learner])
    actor = procs.start("actor", "actor", "--learner", address)
    wait_for(lambda: get_status(address)["learner_steps"] > 0, 120, "training", [replay, learner, actor])

    stats_path = tmp_path / "simulated.json"
    with open(tmp_path / "simulated.log", "wb") as log:
        sim = subprocess.Popen(
            [sys.executable, "-m", "rlfleet.loadgen.simulated_actors", "--learner", address]
            + ["--actors", str(SIMULATED), "--seconds", "30", "--out", str(stats_path)],
            cwd=ROOT,
            env=ENV,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        loaded = wait_for(
            lambda: (s := get_status(address)) and len(s["actors"]) >= SIMULATED + 1 and s,
            60,
            f"{SIMULATED} simulated actors in status",
            [learner, actor],
        )
        steps_at_load = loaded["env_steps"]
        # Under load: status and a new registration answer within a second, every time.
        status_s, register_s = [], []
        with grpc.insecure_channel(address) as ch:
            stub = rlfleet_pb2_grpc.LearnerStub(ch)
            for _ in range(20):
                t = time.monotonic()
                st = stub.GetStatus(rlfleet_pb2.GetStatusRequest(), timeout=5)
                status_s.append(time.monotonic() - t)
                assert len(st.actors) >= SIMULATED + 1
                time.sleep(0.25)
            for _ in range(3):
                t = time.monotonic()
                resp = stub.RegisterActor(rlfleet_pb2.RegisterActorRequest(host="late-actor"), timeout=5)
                register_s.append(time.monotonic() - t)
                stub.Heartbeat(rlfleet_pb2.HeartbeatRequest(actor_id=resp.actor_id, leaving=True), timeout=5)
        assert max(status_s) < 1.0, status_s
        assert max(register_s) < 1.0, register_s
        # The real actor's env steps are counted while the simulated ones are attached.
        wait_for(
            lambda: get_status(address)["env_steps"] > steps_at_load + 500, 60, "env steps under load", [learner, actor]
        )
        assert sim.wait(90) == 0, (tmp_path / "simulated.log").read_text()[-3000:]
    finally:
        if sim.poll() is None:
            sim.send_signal(signal.SIGKILL)
            sim.wait()

    stats, _ = read_stats([stats_path])
    assert len(stats) == SIMULATED
    assert not [s["errors"] for s in stats if s["errors"]]
    # Heartbeat latencies are measured inside the client process, whose one event loop also parses every
    # weights version for 128 actors: its own delays count too, hence p99 < 1 s and every one under 2 s.
    heartbeats = sorted(h for s in stats for h in s["heartbeat_s"])
    assert len(heartbeats) >= SIMULATED * 20, len(heartbeats)
    assert heartbeats[int(0.99 * len(heartbeats))] < 1.0 and heartbeats[-1] < 2.0, heartbeats[-20:]
    assert max(s["register_s"] for s in stats) < 1.0
    fan_out = fan_out_seconds(stats)
    assert len(fan_out) >= 5, fan_out  # new policy versions kept reaching them
    assert all(math.isfinite(t) for t in fan_out.values()), fan_out
    # Leaving heartbeats: status drops the simulated actors at once (not after the heartbeat timeout).
    st = get_status(address)
    assert len(st["actors"]) == 1 and not st["actors"][0]["host"].startswith("simulated-"), st["actors"]


def test_stalled_readers_do_not_hold_up_the_other_actors(procs, tmp_path, free_port):
    """More actors stop reading their weight streams (SIGSTOP: a frozen host) than there are write slots, while
    the learner goes on publishing to them: the other actors keep getting each new version within seconds and
    status answers within a second. (With CartPole's 0.27 MB weights the frozen readers' socket and HTTP/2
    buffers absorb the unread versions for the 25 s watched; keepalive closes their connections after 20-30 s.
    Whether Nature-CNN-sized writes to frozen readers would hold the write slots is not covered here.)"""
    from rlfleet.learner.servicer import MAX_WRITES

    settings = (*DQN, "--set", "publish_every=10", "--set", "eval_every_updates=1000000")
    replay, learner, address = start_replay_and_learner(procs, free_port, settings, tmp_path / "run")
    wait_for(lambda: status_or_none(address), 120, "the learner", [replay, learner])
    actor = procs.start("actor", "actor", "--learner", address)
    wait_for(lambda: get_status(address)["policy_version"] >= 2, 120, "training", [replay, learner, actor])

    def simulated(name, n, seconds, first):
        with open(tmp_path / f"{name}.log", "wb") as log:  # the child holds its own copy of the file
            return subprocess.Popen(
                [sys.executable, "-m", "rlfleet.loadgen.simulated_actors", "--learner", address]
                + ["--actors", str(n), "--seconds", str(seconds), "--first-index", str(first)]
                + ["--out", str(tmp_path / f"{name}.json")],
                cwd=ROOT,
                env=ENV,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    stalled_n = MAX_WRITES + 8
    stalled = simulated("stalled", stalled_n, 300, 0)
    healthy = None
    try:
        wait_for(lambda: len(get_status(address)["actors"]) >= stalled_n + 1, 60, "the actors in status", [learner])
        stalled.send_signal(signal.SIGSTOP)
        time.sleep(5)  # several versions go unread meanwhile
        healthy = simulated("healthy", 8, 25, 1000)
        latencies = []
        while healthy.poll() is None:
            t = time.monotonic()
            get_status(address, timeout_s=5)
            latencies.append(time.monotonic() - t)
            time.sleep(0.5)
        assert healthy.returncode == 0, (tmp_path / "healthy.log").read_text()[-3000:]
        assert max(latencies) < 1.0, latencies
    finally:
        for p in (stalled, healthy):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()
    fan_out = fan_out_seconds(read_stats([tmp_path / "healthy.json"])[0])
    assert len(fan_out) >= 20, fan_out  # about 4 versions a second for 25 s
    assert max(fan_out.values()) < 3.0, fan_out
