"""deploy/docker-compose.yml: `docker-compose config` accepts it, and its service commands work as local processes."""

import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest
import yaml
from helpers import ENV, ROOT, status_or_none, wait_for

from rlfleet.proto.security import ClientSecurity

COMPOSE_FILE = os.path.join(ROOT, "deploy", "docker-compose.yml")
REPLAY_PORT, LEARNER_PORT = "8000", "8001"  # the ports inside the compose network
TOKEN = "compose-test-token"
_VAR = re.compile(r"\$\{(\w+)(?:(:?-)([^}]*))?\}")


def interpolate(value, env):
    """Compose-style ${VAR}, ${VAR-default} and ${VAR:-default} in every string of `value`."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m):
        name, op, default = m.groups()
        got = env.get(name)
        if (op == ":-" and not got) or (op == "-" and got is None):
            return default
        return got or ""

    out = _VAR.sub(sub, value)
    assert "$" not in out, f"uninterpolated variable in {value!r}"
    return out


def test_compose_config_is_valid():
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.skip("docker-compose not installed (Debian/Ubuntu: apt-get install docker-compose; .ci/run does this)")
    env = dict(
        os.environ,
        RLFLEET_ALGO="ppo",
        RLFLEET_ENV="HalfCheetah-v5",
        RLFLEET_TOTAL_STEPS="12345",
        RLFLEET_RUN="cheetah",
        RLFLEET_TOKEN=TOKEN,
        RLFLEET_LEARNER_PORT="9101",
    )
    res = subprocess.run([exe, "-f", COMPOSE_FILE, "config"], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    cfg = yaml.safe_load(res.stdout)
    services = cfg["services"]
    assert set(services) == {"replay", "learner", "actor"}
    replay, learner, actor = (services[k] for k in ("replay", "learner", "actor"))

    # Replay resolves the run's settings once into RUN/settings.json (no one-shot service, whose exit would end
    # an `up --exit-code-from learner`); the learner reads that file.
    assert replay["command"][:7] == ["replay", "--algo", "ppo", "--env", "HalfCheetah-v5", "--config", "default"]
    assert ["--settings-out", "/runs/cheetah/settings.json"] == _after(replay["command"], "--settings-out")
    assert learner["command"][1:3] == ["--run-config", "/runs/cheetah/settings.json"], learner["command"]
    assert "--set" not in learner["command"] and "--algo" not in learner["command"]
    assert "/runs/cheetah/replay" in replay["command"]
    # Replay ends with the learner's run.
    assert ["--learner", f"learner:{LEARNER_PORT}"] == _after(replay["command"], "--learner")
    assert learner["command"][0] == "learner" and "--auto-resume" in learner["command"]
    assert ["--total-steps", "12345"] == _after(learner["command"], "--total-steps")
    assert "/runs/cheetah" in learner["command"]
    assert actor["command"][:3] == ["actor", "--learner", f"learner:{LEARNER_PORT}"]
    for svc in (replay, learner, actor):
        assert svc["environment"]["RLFLEET_TOKEN"] == TOKEN
        assert svc["restart"] == "on-failure:5"  # a refusal (status 2) is not restarted forever

    assert replay["healthcheck"]["test"] == ["CMD", "rlfleet", "health", "--replay", f"localhost:{REPLAY_PORT}"]
    assert learner["healthcheck"]["test"] == ["CMD", "rlfleet", "health", "--learner", f"localhost:{LEARNER_PORT}"]
    # No start order: the learner waits for the settings and the replay server, actors for the learner.
    assert not any("depends_on" in svc for svc in (replay, learner, actor))

    # Reverb has no authentication: the replay port stays on the internal network.
    assert "ports" not in replay
    assert list(replay["networks"]) == ["internal"]
    assert cfg["networks"]["internal"]["internal"] is True
    # Actors scale (--scale actor=N): no fixed name, no host ports.
    assert "ports" not in actor and "container_name" not in actor
    # The learner is published on the host's loopback unless RLFLEET_LEARNER_BIND says otherwise.
    assert [str(p).split("/")[0] for p in learner["ports"]] == [f"127.0.0.1:9101:{LEARNER_PORT}"]
    for svc in (replay, learner):
        assert any(str(v).split(":")[1] == "/runs" for v in svc["volumes"]), svc["volumes"]

    # The overlay for actor machines outside compose publishes replay on one private address only,
    # and refuses to start without that address.
    overlay = [exe, "-f", COMPOSE_FILE, "-f", os.path.join(ROOT, "deploy", "replay-private.yml"), "config"]
    res = subprocess.run(
        overlay, env=dict(env, RLFLEET_PRIVATE_IP="10.0.0.5"), capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    replay = yaml.safe_load(res.stdout)["services"]["replay"]
    assert [str(p).split("/")[0] for p in replay["ports"]] == [f"10.0.0.5:{REPLAY_PORT}:{REPLAY_PORT}"]
    res = subprocess.run(overlay, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode != 0 and "RLFLEET_PRIVATE_IP" in res.stderr

    # The GPU overlay: the learner alone on the GPU image, with one GPU reserved.
    res = subprocess.run(
        [exe, "-f", COMPOSE_FILE, "-f", os.path.join(ROOT, "deploy", "gpu.yml"), "config"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    services = yaml.safe_load(res.stdout)["services"]
    assert services["learner"]["image"] == "rlfleet:gpu" and services["learner"]["build"]["args"]["TF_EXTRA"] == "gpu"
    (device,) = services["learner"]["deploy"]["resources"]["reservations"]["devices"]
    assert device["capabilities"] == ["gpu"] and device["count"] == 1
    assert all("deploy" not in services[k] and services[k]["image"] == "rlfleet:latest" for k in ("replay", "actor"))

    # An actor machine's compose file: actors only, pointed at the published addresses, refusing to start without.
    machine = [exe, "-f", os.path.join(ROOT, "deploy", "actor-machine.yml"), "config"]
    res = subprocess.run(
        machine,
        env=dict(env, RLFLEET_LEARNER="10.0.0.5:8001", RLFLEET_REPLAY="10.0.0.5:8000"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    services = yaml.safe_load(res.stdout)["services"]
    assert list(services) == ["actor"]
    assert services["actor"]["command"][:5] == ["actor", "--learner", "10.0.0.5:8001", "--replay", "10.0.0.5:8000"]
    assert services["actor"]["environment"]["RLFLEET_TOKEN"] == TOKEN
    res = subprocess.run(machine, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode != 0 and "RLFLEET_LEARNER" in res.stderr


def _after(args: list, flag: str) -> list:
    """`flag` and its value in a command's args."""
    return args[args.index(flag) :][:2]


def _local_args(args, ports, runs_dir):
    """A compose command's args for local processes: service hosts -> 127.0.0.1, ports -> free ones, /runs -> tmp."""
    out = []
    for i, a in enumerate(map(str, args)):
        m = re.fullmatch(r"(replay|learner|localhost):(\d+)", a)
        if m:
            a = f"127.0.0.1:{ports[m.group(2)]}"
        elif i > 0 and out[-1] == "--port":
            a = str(ports[a])
        elif a == "/runs" or a.startswith("/runs/"):
            a = runs_dir + a[len("/runs") :]
        out.append(a)
    return out


@pytest.mark.slow
def test_compose_commands_run_locally(procs, tmp_path, free_port):
    with open(COMPOSE_FILE) as f:
        raw = yaml.safe_load(f)
    test_env = {
        "RLFLEET_ALGO": "dqn",
        "RLFLEET_ENV": "CartPole-v1",
        "RLFLEET_TOTAL_STEPS": "3000",
        "RLFLEET_RUN": "compose-run",
        "RLFLEET_TOKEN": TOKEN,
    }
    services = interpolate(raw["services"], test_env)
    ports = {REPLAY_PORT: free_port(), LEARNER_PORT: free_port()}
    runs_dir = str(tmp_path / "runs")
    os.makedirs(runs_dir)

    def service_env(name):
        env = dict(ENV)
        env.pop("RLFLEET_TOKEN", None)
        env.update({k: str(v) for k, v in (services[name].get("environment") or {}).items()})
        return env

    def start(name, svc, label=None):
        cmd = _local_args(services[svc]["command"], ports, runs_dir)
        return procs.start(label or name, *cmd, env=service_env(svc))

    def healthy(svc):
        test = services[svc]["healthcheck"]["test"]
        assert test[:2] == ["CMD", "rlfleet"], test
        res = subprocess.run(
            [sys.executable, "-m", "rlfleet.deploy.cli", *_local_args(test[2:], ports, runs_dir)],
            cwd=ROOT,
            env=service_env(svc),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert res.returncode == 0, f"{svc} health check failed: {res.stdout}{res.stderr}"

    # The services start in any order: here the reverse of the data's flow. Actors wait for the learner; the
    # learner answers status while it waits for the settings the replay server writes, then for the replay server.
    actors = [start("actor", "actor", f"actor{i}") for i in range(2)]
    learner = start("learner", "learner")
    settings_path = os.path.join(runs_dir, "compose-run", "settings.json")
    learner_address = f"127.0.0.1:{ports[LEARNER_PORT]}"
    security = ClientSecurity(token=TOKEN)
    waiting = wait_for(
        lambda: status_or_none(learner_address, security, ready=False), 120, "the waiting status", [learner]
    )
    assert (waiting["phase"], waiting["waiting_for"]) == ("waiting_for_settings", settings_path), waiting
    res = subprocess.run(
        [sys.executable, "-m", "rlfleet.deploy.cli", *_local_args(services["learner"]["healthcheck"]["test"][2:],
                                                                  ports, runs_dir)],
        cwd=ROOT, env=service_env("learner"), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode != 0 and "NOT_SERVING" in res.stdout + res.stderr, res
    time.sleep(6)  # long enough for a line of the wait
    assert f"waiting for the run's settings {settings_path}" in learner.output()
    assert all(a.proc.poll() is None for a in actors), [a.output()[-2000:] for a in actors]
    replay = start("replay", "replay")
    wait_for(lambda: "serving on port" in replay.output(), 120, "replay serving", [replay])
    written = json.loads(open(settings_path).read())
    assert (written["algo"], written["env_id"]) == ("dqn", "CartPole-v1") and written["config"]["min_replay_size"]
    healthy("replay")
    wait_for(lambda: "serving on" in learner.output(), 180, "learner serving", [replay, learner])
    healthy("learner")

    others = {"replay": replay, **{f"actor{i}": a for i, a in enumerate(actors)}}
    exited = {}  # when each of the others exited, seen while the learner runs
    deadline = time.monotonic() + 360
    while learner.proc.poll() is None:
        if time.monotonic() > deadline:
            pytest.fail(f"learner did not finish within 360 s:\n{learner.output()[-3000:]}")
        exited.update({n: time.time() for n, c in others.items() if n not in exited and c.proc.poll() is not None})
        time.sleep(0.1)
    learner_exited_at = time.time()
    assert learner.proc.returncode == 0, learner.output()[-3000:]
    run_dir = os.path.join(runs_dir, "compose-run")
    written_at = os.path.getmtime(os.path.join(run_dir, "summary.json"))
    # Its --linger (60 s) is the most it waits: once the actors and the replay server have stopped, it exits.
    assert learner_exited_at - written_at < 45, (learner_exited_at - written_at, learner.output()[-3000:])
    assert "the actors and the replay server have stopped" in learner.output()
    early = {name: round(written_at - t, 1) for name, t in exited.items() if t < written_at}
    assert not early, f"exited before the learner wrote summary.json (seconds before): {early}"
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    assert summary["algo"] == "dqn" and summary["env_id"] == "CartPole-v1"
    assert summary["env_steps"] >= 3000 and summary["completed"]
    # A finished run ends its actors and the replay server cleanly (exit 0, so `restart: on-failure` leaves them
    # stopped), and each of them only once the learner had written summary.json.
    for c in [*actors, replay]:
        c.proc.wait(timeout=60)
        assert c.proc.returncode == 0, c.output()[-3000:]
    assert "is over (phase done); stopping" in replay.output(), replay.output()[-3000:]
    assert os.listdir(os.path.join(run_dir, "replay")), "no Reverb checkpoint in RUN/replay"
