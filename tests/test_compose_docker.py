"""The compose cluster under a real Docker engine, as a user runs it: the image built offline
(deploy/build-image.sh --offline), deploy/docker-compose.yml scaled, its learner killed, an actor machine attached
with deploy/actor-machine.yml from a second compose project, and the run finishing by itself.

Needs docker, docker-compose (Debian's 1.29 or later), mmdebstrap, python3.11 and an engine that answers
(DOCKER_HOST is honoured); `.ci/run` installs them and starts a private dockerd as root. Skipped, with the reason,
where no engine answers.
"""

import json
import os
import shutil
import time

import portpicker
import pytest
from helpers import docker_engine_problem, run_checked, wait_for_status

from rlfleet.deploy.status import StatusError, get_status
from rlfleet.proto.security import ClientSecurity

DOCKER, COMPOSE = shutil.which("docker"), shutil.which("docker-compose")
TOKEN = "compose-docker-test-token"
TOTAL_STEPS = 30000  # DQN on CartPole-v1: long enough to scale, kill and attach while it trains
RUN = "ci"


_PROBLEM = docker_engine_problem(["docker", "docker-compose", "mmdebstrap", "python3.11"])
pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.skipif(_PROBLEM is not None, reason=str(_PROBLEM))]
_run = run_checked


class Log:
    """Timestamped progress lines (shown by pytest when the test fails)."""

    def __init__(self):
        self.t0 = time.monotonic()

    def __call__(self, msg: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.1f}s] {msg}", flush=True)


@pytest.fixture(scope="module")
def image(rlfleet_image):
    """The image, built offline once for the test session (conftest.py)."""
    return rlfleet_image


def test_up_returns_the_learners_exit_status(image):
    """`up --exit-code-from learner` in the foreground: the run ends the cluster, and `up` returns 0 only after
    the learner wrote summary.json (the first container to exit would stop the others)."""
    project = f"rlct{os.getpid()}x"
    env = dict(
        os.environ,
        RLFLEET_IMAGE=image,
        RLFLEET_TOTAL_STEPS="4000",
        RLFLEET_RUN="fg",
        RLFLEET_LEARNER_PORT=str(portpicker.pick_unused_port()),
    )  # algo and env: the compose file's defaults (dqn, CartPole-v1)
    files = ["-f", "deploy/docker-compose.yml"]
    try:
        res = _run(
            COMPOSE, "-p", project, *files, "up", "--no-build", "--scale", "actor=2", "--exit-code-from", "learner",
            env=env, timeout=600, check=False,
        )  # fmt: skip
        assert res.returncode == 0, f"up returned {res.returncode}:\n{res.stdout[-6000:]}\n{res.stderr[-3000:]}"
        out = res.stdout
        # Nothing exited (which stops every container) before the learner had finished: its final evaluation
        # and summary.json; then replay and actors ended by themselves.
        finished, abort = out.find(" INFO finished; checkpoint "), out.find("Aborting on container exit")
        assert 0 <= finished < abort, out[-6000:]
        assert out.count("stopped after") == 2, out[-6000:]  # both actors
        cat = [DOCKER, "run", "--rm", "--network", "none", "-v", f"{project}_runs:/runs", "--entrypoint", "cat", image]
        summary = json.loads(_run(*cat, "/runs/fg/summary.json").stdout)
        assert summary["completed"] and summary["env_steps"] >= 4000, summary
    finally:
        _run(COMPOSE, "-p", project, *files, "down", "-v", "-t", "30", env=env, check=False)


def test_compose_cluster_under_docker(tmp_path, image):
    log = Log()
    log(f"image {image} built offline")

    tag = f"rlct{os.getpid()}"
    cluster, machine, net = f"{tag}a", f"{tag}b", f"{tag}-machines"
    learner_port, replay_port = portpicker.pick_unused_port(), portpicker.pick_unused_port()
    cluster_files = ["-f", "deploy/docker-compose.yml", "-f", "deploy/replay-private.yml"]
    machine_override = tmp_path / "machine-network.yml"  # the actor machine's own network, made below
    machine_files = ["-f", "deploy/actor-machine.yml", "-f", str(machine_override)]
    security = ClientSecurity(token=TOKEN)
    env = dict(os.environ)
    address = f"127.0.0.1:{learner_port}"

    def status():
        try:
            return get_status(address, 5, security)
        except StatusError:
            return None

    def wait_status(pred, timeout, what):
        logs = lambda: _run(COMPOSE, "-p", cluster, *cluster_files, "logs", "--tail", "40", env=env, check=False)
        return wait_for_status(status, pred, timeout, what, lambda: logs().stdout[-6000:])

    def container(project, service):
        ids = _run(
            DOCKER, "ps", "-aq", "--filter", f"label=com.docker.compose.project={project}",
            "--filter", f"label=com.docker.compose.service={service}",
        ).stdout.split()  # fmt: skip
        return ids

    try:
        # The actor machine's network: a bridge of its own, whose gateway address on this host stands for the
        # learner host's private address (the replay and learner ports are published on it, nowhere else).
        _run(DOCKER, "network", "create", net)
        gateway = _run(DOCKER, "network", "inspect", "-f", "{{(index .IPAM.Config 0).Gateway}}", net).stdout.strip()
        assert gateway, "the test network has no gateway address"
        machine_override.write_text(f"networks:\n  default:\n    external: true\n    name: {net}\n")
        env.update(
            RLFLEET_IMAGE=image,
            RLFLEET_ALGO="dqn",
            RLFLEET_ENV="CartPole-v1",
            RLFLEET_TOTAL_STEPS=str(TOTAL_STEPS),
            RLFLEET_RUN=RUN,
            RLFLEET_TOKEN=TOKEN,
            RLFLEET_LEARNER_PORT=str(learner_port),
            RLFLEET_REPLAY_PORT=str(replay_port),
            RLFLEET_PRIVATE_IP=gateway,
            RLFLEET_CHECKPOINT_INTERVAL="10",
            RLFLEET_LEARNER=f"{gateway}:{learner_port}",
            RLFLEET_REPLAY=f"{gateway}:{replay_port}",
        )

        # 1. Two actors: `up -d` starts the three services at once (no start order); they find each other.
        _run(COMPOSE, "-p", cluster, *cluster_files, "up", "-d", "--no-build", "--scale", "actor=2", env=env)
        st = wait_status(lambda s: len(s["actors"]) == 2 and s["env_steps"] > 0, 240, "2 actors training")
        log(f"2 actors in status, env steps {st['env_steps']}, policy version {st['policy_version']}")

        # 2. A third actor joins while it trains, with the weights of the moment.
        before = {a["actor_id"] for a in st["actors"]}
        version_at_scale = st["policy_version"]
        _run(COMPOSE, "-p", cluster, *cluster_files, "up", "-d", "--no-build", "--scale", "actor=3", env=env)
        st = wait_status(
            lambda s: len(s["actors"]) == 3 and all(a["policy_version"] >= 0 for a in s["actors"]), 180, "3 actors"
        )
        new = [a for a in st["actors"] if a["actor_id"] not in before]
        assert len(new) == 1 and new[0]["policy_version"] >= version_at_scale, (st["actors"], version_at_scale)
        log(f"3rd actor joined at policy version {new[0]['policy_version']} (learner was at {version_at_scale})")

        # 3. The learner crashes after a checkpoint (its process SIGKILLed, as by the OOM killer): the restart
        # policy and --auto-resume bring it back, the actors rejoin by themselves and the env-step count does not
        # go back. (`docker kill` would not do: Docker takes it for a manual stop and restarts nothing.)
        (learner_id,) = container(cluster, "learner")
        _wait_exec(cluster, cluster_files, env, f"test -f /runs/{RUN}/checkpoints/checkpoint", 120)
        st = status()
        env_steps_before = st["env_steps"]
        killed_at = time.monotonic()
        # kill -9 -1: every process of the container's user but the container's init (tini) and the caller
        _run(DOCKER, "exec", learner_id, "sh", "-c", "kill -9 -1", check=False)
        log(f"learner process killed at env steps {env_steps_before}")
        st = wait_status(
            lambda s: s["uptime_seconds"] < time.monotonic() - killed_at and len(s["actors"]) == 3, 240, "learner back"
        )
        log(f"learner back, env steps {st['env_steps']}, {len(st['actors'])} actors")
        assert st["env_steps"] >= env_steps_before, (st["env_steps"], env_steps_before)
        restarts = _run(DOCKER, "inspect", "-f", "{{.RestartCount}}", learner_id).stdout.strip()
        assert int(restarts) >= 1

        # 4. An actor machine: a second compose project on its own network, reaching the cluster only through
        # the published addresses.
        _run(COMPOSE, "-p", machine, *machine_files, "up", "-d", "--no-build", env=env)
        (machine_actor,) = container(machine, "actor")
        host = _run(DOCKER, "inspect", "-f", "{{.Config.Hostname}}", machine_actor).stdout.strip()
        st = wait_status(lambda s: host in {a["host"] for a in s["actors"]}, 180, "the actor machine's actor")
        assert st["env_steps"] < TOTAL_STEPS, "the run ended before the actor machine attached: raise TOTAL_STEPS"
        log(f"actor machine's actor {host} in status ({len(st['actors'])} actors)")

        # 5. The run finishes: the learner exits 0 and every other container exits by itself.
        res = _run(DOCKER, "wait", learner_id, timeout=900)
        assert res.stdout.strip() == "0", _run(DOCKER, "logs", "--tail", "60", learner_id, check=False).stderr
        log("learner exited 0")
        everything = container(cluster, "replay") + container(cluster, "actor") + container(machine, "actor")
        deadline = time.monotonic() + 120
        while True:
            states = {
                c: _run(DOCKER, "inspect", "-f", "{{.State.Status}} {{.State.ExitCode}}", c).stdout.split()
                for c in everything
            }
            if all(s[0] == "exited" for s in states.values()) or time.monotonic() > deadline:
                break
            time.sleep(2)
        assert all(s == ["exited", "0"] for s in states.values()), states
        log(f"{len(everything)} other containers exited 0")
        cat = [DOCKER, "run", "--rm", "--network", "none", "-v", f"{cluster}_runs:/runs", "--entrypoint", "cat", image]
        summary = json.loads(_run(*cat, f"/runs/{RUN}/summary.json").stdout)
        assert summary["completed"] and summary["env_steps"] >= TOTAL_STEPS, summary
        assert summary["final_eval_episodes"] > 0
        log(f"summary.json: env steps {summary['env_steps']}, final eval {summary['final_eval_return_mean']}")
    finally:
        for project, files in ((machine, machine_files), (cluster, cluster_files)):
            _run(COMPOSE, "-p", project, *files, "down", "-v", "--remove-orphans", "-t", "30", env=env, check=False)
        _run(DOCKER, "network", "rm", net, check=False)
    for project in (cluster, machine):
        left = _run(DOCKER, "ps", "-aq", "--filter", f"label=com.docker.compose.project={project}").stdout.split()
        assert not left, f"containers left by `down -v`: {left}"
    volumes = _run(DOCKER, "volume", "ls", "-q").stdout.split()
    assert f"{cluster}_runs" not in volumes
    log("down -v left nothing")


def _wait_exec(project, files, env, command, timeout):
    """Waits until `command` (a shell line) succeeds inside the project's learner container."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        res = _run(
            COMPOSE, "-p", project, *files, "exec", "-T", "learner", "sh", "-c", command, env=env, check=False
        )  # fmt: skip
        if res.returncode == 0:
            return
        time.sleep(2)
    raise AssertionError(f"timed out after {timeout}s waiting for `{command}` in the learner")
