"""deploy/docker-compose.yml with deploy/swarm.yml as a Docker Swarm stack on two real nodes on this machine.

Each node is a dockerd of its own in a network namespace and UTS namespace the test makes (hostnames
rlfleet-node1 and rlfleet-node2), the two joined by a veth pair with private addresses; nothing else is reached.
The image, built offline (conftest.py), is moved to both with `docker save | docker load` (no registry). A small
DQN CartPole run is deployed with actors on both nodes, scaled by one, its learner container killed (the restart
policy and --auto-resume bring it back; env steps never go back), and run to its end; then `stack rm` and
`swarm leave` must leave no container, network or volume of it, and the namespaces and engines go.

Needs root, docker, dockerd, nsenter, unshare, ip and an engine that answers for the image build (`.ci/run`
starts a private dockerd); skipped with the reason otherwise.
"""

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest
from helpers import docker_engine_problem, run_checked, stop_group, wait_for_status

DOCKER, DOCKERD = shutil.which("docker"), shutil.which("dockerd")
TOKEN = "swarm-test-token"
# DQN on CartPole-v1: long enough to scale and kill the learner while it trains, and for the run to outlast the
# new learner's start and the actors' rejoining (they collect on meanwhile, and their steps count once they rejoin).
TOTAL_STEPS = 150_000
RUN = "swarm"
STACK = "rlt"
LEARNER_PORT = 8001
# Task states before a task's end (docker service ps' CURRENT STATE column starts with one of them).
RUNNING = {"New", "Pending", "Assigned", "Accepted", "Ready", "Preparing", "Starting", "Running"}


def _problem() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces and engines of its own)"
    return docker_engine_problem(["docker", "dockerd", "nsenter", "unshare", "ip", "mmdebstrap", "python3.11"])


_PROBLEM = _problem()
pytestmark = [
    pytest.mark.docker,
    pytest.mark.root,
    pytest.mark.slow,
    pytest.mark.skipif(_PROBLEM is not None, reason=str(_PROBLEM)),
]
_run = run_checked


def _log(t0: float, msg: str) -> None:
    print(f"[{time.monotonic() - t0:6.1f}s] {msg}", flush=True)


class Node:
    """A dockerd in network and UTS namespaces of its own, with its own data, exec root and socket under
    `folder`; kept local and offline as .ci/run keeps its engine (--dns 127.0.0.1, no registry lookups)."""

    def __init__(self, folder, name: str, netns: str, address: str):
        self.name, self.netns, self.address = name, netns, address
        self.folder = folder / name
        self.folder.mkdir()
        # The engine's sockets live under its exec root: a folder with a short path, since containerd refuses a
        # unix socket path over 104 bytes, which a deep pytest folder exceeds.
        self.exec_root = tempfile.mkdtemp(prefix=f"rlfleet-{name}-", dir="/tmp")
        self.sock = f"unix://{self.exec_root}/sock"
        engine = [
            DOCKERD, "--storage-driver=overlay2", "--iptables=false", "--ip-masq=false", "--dns", "127.0.0.1",
            "--data-root", self.folder / "data", "--exec-root", os.path.join(self.exec_root, "exec"), "--pidfile",
            self.folder / "pid", "-H", self.sock, "--containerd-namespace", name,
            "--containerd-plugins-namespace", f"{name}-plugins",
        ]  # fmt: skip
        self.log = open(self.folder / "log", "wb")
        # nsenter --net keeps this machine's /sys (and its cgroup mounts), which `ip netns exec` would replace.
        self.proc = subprocess.Popen(
            ["nsenter", f"--net=/var/run/netns/{netns}", "unshare", "--uts", "sh", "-c",
             'hostname "$0" && exec "$@"', f"rlfleet-{name}", *map(str, engine)],
            env=dict(os.environ, DOCKER_SERVICE_PREFER_OFFLINE_IMAGE="1"),
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while self.docker("info", check=False).returncode != 0:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"dockerd of {name} did not answer:\n{(self.folder / 'log').read_text()[-3000:]}")
            time.sleep(1)

    def docker(self, *args, **kwargs) -> subprocess.CompletedProcess:
        return _run(DOCKER, "-H", self.sock, *args, **kwargs)

    def in_netns(self, *cmd, **kwargs) -> subprocess.CompletedProcess:
        return _run("nsenter", f"--net=/var/run/netns/{self.netns}", *cmd, **kwargs)

    def stop(self) -> None:
        """Stops the engine, then unmounts what it left mounted under its folder (the network namespaces of
        its containers and of Swarm's ingress: bind mounts that would keep them alive), deepest first."""
        stop_group(self.proc, timeout=60)
        self.log.close()
        for mount in sorted(_mounts_under(self.folder) + _mounts_under(self.exec_root), reverse=True):
            _run("umount", "-l", mount, check=False)
        shutil.rmtree(self.exec_root, ignore_errors=True)


def _mounts_under(folder) -> list[str]:
    """Mount points at or under `folder` (/proc/self/mountinfo; octal escapes as the kernel writes them)."""
    prefix = os.path.realpath(folder)
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4].replace("\\040", " ") for line in f]
    return [p for p in points if p == prefix or p.startswith(prefix + os.sep)]


# Where Docker's network code writes the load balancers' files of a Swarm's overlay networks, whatever the engine's
# --data-root: the test removes what its engines added there.
LB_FILES = "/var/lib/docker/network/files"


def _lb_files() -> set[str]:
    try:
        return {name for name in os.listdir(LB_FILES) if name.startswith("lb_")}
    except FileNotFoundError:
        return set()


@contextlib.contextmanager
def two_nodes(folder, tag: str):
    """Two engines (`Node`) in namespaces joined by a veth pair (10.213.0.1 and .2); everything removed after."""
    netns = [f"{tag}n1", f"{tag}n2"]
    addresses = ["10.213.0.1", "10.213.0.2"]
    nodes = []
    lb_before = _lb_files()
    try:
        for ns in netns:
            _run("ip", "netns", "add", ns)
            _run("ip", "-n", ns, "link", "set", "lo", "up")
        _run("ip", "link", "add", f"{tag}v1", "netns", netns[0], "type", "veth", "peer", "name", f"{tag}v2", "netns",
             netns[1])  # fmt: skip
        for i, (ns, address) in enumerate(zip(netns, addresses), start=1):
            _run("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", f"{tag}v{i}")
            _run("ip", "-n", ns, "link", "set", f"{tag}v{i}", "up")
        for i, (ns, address) in enumerate(zip(netns, addresses), start=1):
            nodes.append(Node(folder, f"node{i}", ns, address))
        yield nodes
    finally:
        for node in nodes:
            node.stop()
        for ns in netns:
            _run("ip", "netns", "delete", ns, check=False)
        for node in nodes:  # the engines' files (image layers: several GB); their exec roots went with them
            _run("rm", "-rf", node.folder / "data")
            assert not os.path.exists(node.exec_root), node.exec_root
        for name in sorted(_lb_files() - lb_before):
            shutil.rmtree(os.path.join(LB_FILES, name), ignore_errors=True)
        assert not _mounts_under(folder), _mounts_under(folder)
        assert not _lb_files() - lb_before, _lb_files() - lb_before


def test_swarm_stack_on_two_nodes(tmp_path, rlfleet_image):
    t0 = time.monotonic()
    tag = f"rls{os.getpid() % 100000}"
    image_tar = tmp_path / "image.tar"
    _run(DOCKER, "save", "-o", image_tar, rlfleet_image, timeout=600)
    _log(t0, f"image {rlfleet_image} saved ({image_tar.stat().st_size / 2**30:.1f} GiB)")
    with two_nodes(tmp_path, tag) as (node1, node2):
        for node in (node1, node2):
            node.docker("load", "-i", image_tar, timeout=600)
        image_tar.unlink()
        _log(t0, "two engines up, the image loaded on both")

        node1.docker("swarm", "init", "--advertise-addr", node1.address, "--listen-addr", f"{node1.address}:2377")
        join = node1.docker("swarm", "join-token", "-q", "worker").stdout.strip()
        node2.docker("swarm", "join", "--token", join, "--advertise-addr", node2.address, f"{node1.address}:2377")
        manager_id = node1.docker("info", "-f", "{{.Swarm.NodeID}}").stdout.strip()
        node1.docker("node", "update", "--label-add", "rlfleet.server=true", manager_id)
        node1.docker("secret", "create", "rlfleet_token", "-", stdin=TOKEN)
        nodes = node1.docker("node", "ls", "--format", "{{.Hostname}} {{.Status}}").stdout.strip().split("\n")
        assert sorted(nodes) == ["rlfleet-node1 Ready", "rlfleet-node2 Ready"], nodes
        _log(t0, "swarm of two nodes")

        env = {k: v for k, v in os.environ.items() if k != "RLFLEET_TOKEN"} | dict(
            RLFLEET_IMAGE=rlfleet_image, RLFLEET_ALGO="dqn", RLFLEET_ENV="CartPole-v1",
            RLFLEET_TOTAL_STEPS=str(TOTAL_STEPS), RLFLEET_RUN=RUN, RLFLEET_CHECKPOINT_INTERVAL="10",
            RLFLEET_ACTORS="2", RLFLEET_LEARNER_PORT=str(LEARNER_PORT),
        )  # fmt: skip
        files = ["-c", "deploy/docker-compose.yml", "-c", "deploy/swarm.yml"]
        try:
            node1.docker("stack", "deploy", "--resolve-image", "never", *files, STACK, env=env)
            _deploy_scale_kill_finish(t0, node1, rlfleet_image)
        finally:
            node1.docker("stack", "rm", STACK, check=False)
            _wait_empty(node1, node2)
            node1.docker("volume", "rm", f"{STACK}_runs", check=False)
            node2.docker("swarm", "leave", "--force", check=False)
            node1.docker("swarm", "leave", "--force", check=False)
        for node in (node1, node2):
            assert node.docker("ps", "-aq").stdout.split() == [], f"containers left on {node.name}"
            assert node.docker("volume", "ls", "-q").stdout.split() == [], f"volumes left on {node.name}"
            networks = node.docker("network", "ls", "--format", "{{.Name}}").stdout.split()
            assert not [n for n in networks if n.startswith(f"{STACK}_")], networks
            assert node.docker("info", "-f", "{{.Swarm.LocalNodeState}}").stdout.strip() == "inactive"
        _log(t0, "stack rm and swarm leave left nothing")
    assert not [ns for ns in _run("ip", "netns", "list").stdout.split() if ns.startswith(tag)]


def _deploy_scale_kill_finish(t0, node1, image: str) -> None:
    def status():
        res = node1.in_netns(
            sys.executable, "-m", "rlfleet.deploy.cli", "status", "--learner", f"127.0.0.1:{LEARNER_PORT}",
            "--token", TOKEN, "--json", "--timeout", "5", check=False, timeout=60,
        )  # fmt: skip
        return json.loads(res.stdout) if res.returncode == 0 else None

    def wait_status(pred, timeout, what):
        tasks = lambda: node1.docker("stack", "ps", "--no-trunc", STACK, check=False).stdout
        return wait_for_status(status, pred, timeout, what, tasks, period=2.0)

    # 1. Two actors, spread over the nodes: one on node 2 reaches replay and learner over the overlay networks.
    st = wait_status(lambda s: len(s["actors"]) == 2 and s["env_steps"] > 0, 300, "2 actors training")
    hosts = sorted(a["host"] for a in st["actors"])
    assert any(h.startswith("rlfleet-node2-actor") for h in hosts), hosts
    _log(t0, f"2 actors training: {hosts}, env steps {st['env_steps']}")

    # 2. One more actor while it trains.
    node1.docker("service", "scale", "--detach", f"{STACK}_actor=3")
    st = wait_status(
        lambda s: len(s["actors"]) == 3 and all(a["policy_version"] >= 0 for a in s["actors"]), 240, "3 actors"
    )
    _log(t0, f"3 actors: {sorted(a['host'] for a in st['actors'])}")

    # 3. The learner's container killed after a checkpoint: Swarm starts a new task on the same node and volume,
    # which resumes; the actors rejoin and env steps do not go back.
    (learner,) = node1.docker(
        "ps", "-q", "--filter", f"label=com.docker.swarm.service.name={STACK}_learner"
    ).stdout.split()
    deadline = time.monotonic() + 180
    while node1.docker("exec", learner, "test", "-f", f"/runs/{RUN}/checkpoints/checkpoint", check=False).returncode:
        assert time.monotonic() < deadline, "no learner checkpoint within 180 s"
        time.sleep(2)
    before = wait_status(lambda s: True, 60, "status")["env_steps"]
    killed_at = time.monotonic()
    node1.docker("kill", learner)
    _log(t0, f"learner container killed at env steps {before}")
    seen = []  # (seconds since the kill, env steps, actors) of each answer of the new learner

    def back(s):
        if s["uptime_seconds"] >= time.monotonic() - killed_at:
            return False  # the killed learner still answering
        seen.append((round(time.monotonic() - killed_at, 1), s["env_steps"], len(s["actors"])))
        return len(s["actors"]) == 3

    st = wait_status(back, 300, "the learner back")
    assert st["env_steps"] >= before, (st["env_steps"], before)
    assert st["env_steps"] < TOTAL_STEPS, f"the run ended before the learner came back: raise TOTAL_STEPS ({seen})"
    _log(t0, f"learner back at env steps {st['env_steps']} with {len(st['actors'])} actors; answers {seen}")

    # 4. The run ends: every task ends by itself with exit status 0 (no restart of a finished run); the killed
    # learner's task is the only failed one.
    deadline = time.monotonic() + 600
    while True:
        tasks = _tasks(node1)
        if not [t for t in tasks if t["current"].split()[0] in RUNNING]:
            break
        assert time.monotonic() < deadline, f"the run did not end within 600 s of {TOTAL_STEPS} env steps: {tasks}"
        time.sleep(3)
    failed = [t for t in tasks if not t["current"].startswith("Complete")]
    assert [t["name"].split(".")[0] for t in failed] == [f"{STACK}_learner"], tasks
    assert "exit (137)" in failed[0]["error"], failed
    assert sorted(t["name"].split(".")[0] for t in tasks if t["current"].startswith("Complete")) == sorted(
        [f"{STACK}_actor"] * 3 + [f"{STACK}_learner", f"{STACK}_replay"]
    ), tasks
    summary = json.loads(
        node1.docker(
            "run",
            "--rm",
            "--network",
            "none",
            "-v",
            f"{STACK}_runs:/runs",
            "--entrypoint",
            "cat",
            image,
            f"/runs/{RUN}/summary.json",
        ).stdout  # fmt: skip
    )
    assert summary["completed"] and summary["env_steps"] >= TOTAL_STEPS, summary
    _log(t0, f"finished: env steps {summary['env_steps']}, final eval {summary['final_eval_return_mean']}")


def _tasks(node) -> list[dict]:
    """Every task of the stack, on both nodes: name, desired and current state, error."""
    out = node.docker(
        "stack", "ps", "--no-trunc", "--format", "{{.Name}}\t{{.DesiredState}}\t{{.CurrentState}}\t{{.Error}}", STACK
    ).stdout
    rows = [line.split("\t") for line in out.strip().split("\n") if line]
    return [dict(name=r[0].strip(" \\_"), desired=r[1], current=r[2], error=r[3] if len(r) > 3 else "") for r in rows]


def _wait_empty(*nodes, timeout=120) -> None:
    """Waits until no container is left on any node (`stack rm` returns before they are gone)."""
    deadline = time.monotonic() + timeout
    while any(n.docker("ps", "-aq").stdout.split() for n in nodes) and time.monotonic() < deadline:
        time.sleep(2)
