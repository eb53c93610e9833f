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
from helpers import ENV, ROOT, wait_for

pytestmark = [pytest.mark.root, pytest.mark.slow]

CLUSTER_IP, ACTOR_IP = "10.213.0.1", "10.213.0.2"
DQN = ("--algo", "dqn", "--env", "CartPole-v1", "--set", "min_replay_size=300")


def _ip(*args):
    out = subprocess.run(["ip", *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed: {out.stderr.strip()} (this test needs root and iproute2)")


@pytest.fixture
def machines():
    """Two network namespaces joined by a veth pair: {"cluster": name, "actor": name}."""
    tag = f"rlf{os.getpid() % 100000}"
    names = {"cluster": f"{tag}c", "actor": f"{tag}a"}
    try:
        for ns in names.values():
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("link", "add", f"{tag}vc", "type", "veth", "peer", "name", f"{tag}va")
        for role, ip, dev in (("cluster", CLUSTER_IP, f"{tag}vc"), ("actor", ACTOR_IP, f"{tag}va")):
            _ip("link", "set", dev, "netns", names[role])
            _ip("-n", names[role], "addr", "add", f"{ip}/24", "dev", dev)
            _ip("-n", names[role], "link", "set", dev, "up")
        yield names
    finally:
        for ns in names.values():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


class NsProc:
    """An rlfleet command running inside network namespace `ns`."""

    def __init__(self, tmp_path, ns, name, *args):
        self.log_path = tmp_path / f"{name}.log"
        self.log = open(self.log_path, "wb")
        cmd = ["ip", "netns", "exec", ns, sys.executable, "-m", "rlfleet.deploy.cli", *map(str, args)]
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=ENV, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def output(self):
        return self.log_path.read_text(errors="replace")

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


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
