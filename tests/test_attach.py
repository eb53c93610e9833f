"""An extra actor machine attaches to a running cluster across a real network.

The test makes two network namespaces, its own "machines", joined by a veth
pair on private addresses: the cluster machine (replay, learner, one actor)
at 10.213.0.1 and an actor machine at 10.213.0.2. The learner listens on
10.213.0.1 only. The actor machine attaches while the cluster trains, shows up
in status with its address, leaves the list after the heartbeat timeout when
killed, and a new actor there starts from the current weights. Needs root
(CAP_NET_ADMIN) and iproute2, as CI has; the namespaces are removed at the end.
"""

import json
import os
import signal
import subprocess
import sys

import pytest
from helpers import ENV, ROOT, NsProc, two_machines, wait_for

pytestmark = [pytest.mark.root, pytest.mark.slow]

CLUSTER_IP, ACTOR_IP = "10.213.0.1", "10.213.0.2"
DQN = ("--algo", "dqn", "--env", "CartPole-v1", "--set", "min_replay_size=300")


@pytest.fixture
def machines():
    """Two network namespaces joined by a veth pair: {"cluster": name, "actor": name}."""
    with two_machines({"cluster": CLUSTER_IP, "actor": ACTOR_IP}) as names:
        yield names


def test_actor_machine_attaches_and_rejoins(machines, tmp_path):
    started = []

    def start(ns, name, *args):
        p = NsProc(tmp_path, machines[ns], name, *args)
        started.append(p)
        return p

    learner_address = f"{CLUSTER_IP}:8001"

    def status():
        out = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                machines["cluster"],
                sys.executable,
                "-m",
                "rlfleet.deploy.cli",
                "status",
                "--learner",
                learner_address,
                "--json",
                "--timeout",
                "3",
            ],
            cwd=ROOT,
            env=ENV,
            capture_output=True,
            text=True,
        )
        return json.loads(out.stdout) if out.returncode == 0 else None

    def actor_at(st, ip):
        return next((a for a in st["actors"] if a["address"] == ip), None) if st else None

    try:
        replay = start("cluster", "replay", "replay", *DQN, "--port", 8000)
        learner = start(
            "cluster",
            "learner",
            "learner",
            *DQN,
            "--replay",
            "127.0.0.1:8000",
            "--replay-for-actors",
            f"{CLUSTER_IP}:8000",
            "--bind",
            CLUSTER_IP,
            "--port",
            8001,
            "--logdir",
            tmp_path / "run",
            "--total-steps",
            10**7,
            "--actor-timeout",
            3,
        )
        wait_for(status, 180, "the learner on the cluster machine", [replay, learner])
        local = start("cluster", "actor-local", "actor", "--learner", learner_address)
        before = wait_for(
            lambda: (s := status()) and s["learner_steps"] > 50 and s, 240, "the cluster to train", [learner, local]
        )

        # A second machine attaches while the cluster trains.
        remote = start("actor", "actor-remote", "actor", "--learner", learner_address)
        joined = wait_for(
            lambda: (s := status()) and (a := actor_at(s, ACTOR_IP)) and a["env_steps"] > 200 and s,
            120,
            "the actor machine to join and collect",
            [learner, remote],
        )
        a = actor_at(joined, ACTOR_IP)
        assert a["num_envs"] > 0 and a["host"]
        assert a["policy_version"] >= before["policy_version"]  # it acts with current weights, not stale ones
        assert len(joined["actors"]) == 2

        # Killed without warning, it leaves the status list after the heartbeat timeout; training goes on.
        os.killpg(remote.proc.pid, signal.SIGKILL)
        remote.proc.wait()
        gone = wait_for(
            lambda: (s := status()) and actor_at(s, ACTOR_IP) is None and s,
            60,
            "the dead actor to leave the list",
            [learner, local],
        )
        assert len(gone["actors"]) == 1 and gone["env_steps"] >= joined["env_steps"]

        # A rejoining actor machine gets a new id and starts from the current weights.
        again = start("actor", "actor-remote-2", "actor", "--learner", learner_address)
        rejoined = wait_for(
            lambda: (s := status()) and (a := actor_at(s, ACTOR_IP)) and a["policy_version"] >= 0 and s,
            120,
            "the actor machine to rejoin",
            [learner, again],
        )
        r = actor_at(rejoined, ACTOR_IP)
        assert r["actor_id"] != a["actor_id"]
        assert r["policy_version"] >= gone["policy_version"]
        # Env steps come from heartbeats (every second), learner steps from the learner itself: 50 learner steps
        # can pass before the next heartbeat, so both are waited for.
        wait_for(
            lambda: (
                (s := status())
                and s["learner_steps"] > rejoined["learner_steps"] + 50
                and s["env_steps"] > rejoined["env_steps"]
                and s
            ),
            120,
            "learning and collection to continue",
            [learner, local, again],
        )
    finally:
        for p in reversed(started):
            p.stop()
