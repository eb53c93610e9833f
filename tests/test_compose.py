"""deploy/docker-compose.yml: `docker-compose config` accepts it, and its service commands work as local processes."""

import json
import os
import re
import shutil
import subprocess
import sys

import conftest
import pytest
import yaml
from conftest import ROOT, wait_for

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
    assert set(services) == {"settings", "replay", "learner", "actor"}
    settings, replay, learner, actor = (services[k] for k in ("settings", "replay", "learner", "actor"))

    # One resolved settings file, read by replay and learner alike.
    assert settings["command"][:5] == ["settings", "--algo", "ppo", "--env", "HalfCheetah-v5"]
    assert settings["command"][-2:] == ["--out", "/runs/cheetah/settings.json"]
    assert settings["restart"] == "no"
    for svc in (replay, learner):
        assert svc["command"][1:3] == ["--run-config", "/runs/cheetah/settings.json"], svc["command"]
        assert "--set" not in svc["command"] and "--algo" not in svc["command"]
    assert replay["depends_on"]["settings"]["condition"] == "service_completed_successfully"
    assert "/runs/cheetah/replay" in replay["command"]
    assert learner["command"][0] == "learner" and "--auto-resume" in learner["command"]
    assert ["--total-steps", "12345"] == learner["command"][learner["command"].index("--total-steps") :][:2]
    assert "/runs/cheetah" in learner["command"]
    assert actor["command"][:3] == ["actor", "--learner", f"learner:{LEARNER_PORT}"]
    for svc in (learner, actor):
        assert svc["environment"]["RLFLEET_TOKEN"] == TOKEN

    assert replay["healthcheck"]["test"] == ["CMD", "rlfleet", "health", "--replay", f"localhost:{REPLAY_PORT}"]
    assert learner["healthcheck"]["test"] == ["CMD", "rlfleet", "health", "--learner", f"localhost:{LEARNER_PORT}"]
    assert learner["depends_on"]["replay"]["condition"] == "service_healthy"
    assert actor["depends_on"]["learner"]["condition"] == "service_healthy"

    # Reverb has no authentication: the replay port stays on the internal network.
    assert "ports" not in replay
    assert list(replay["networks"]) == ["internal"]
    assert cfg["networks"]["internal"]["internal"] is True
    # Actors scale (--scale actor=N): no fixed name, no host ports.
    assert "ports" not in actor and "container_name" not in actor
    # The learner is published on the host's loopback unless RLFLEET_LEARNER_BIND says otherwise.
    assert [str(p).split("/")[0] for p in learner["ports"]] == [f"127.0.0.1:9101:{LEARNER_PORT}"]
    for svc in (settings, replay, learner):
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


def test_compose_commands_run_locally(procs, tmp_path, free_port, monkeypatch):
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
        env = dict(conftest.ENV)
        env.pop("RLFLEET_TOKEN", None)
        env.update({k: str(v) for k, v in (services[name].get("environment") or {}).items()})
        return env

    def start(name, svc, label=None):
        cmd = _local_args(services[svc]["command"], ports, runs_dir)
        with monkeypatch.context() as m:  # conftest.Proc takes its environment from conftest.ENV
            m.setattr(conftest, "ENV", service_env(svc))
            return procs.start(label or name, *cmd)

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

    # The order depends_on gives: settings written, replay healthy, then learner healthy, then actors.
    settings = start("settings", "settings")
    assert settings.proc.wait(timeout=120) == 0, settings.output()
    written = json.loads(open(os.path.join(runs_dir, "compose-run", "settings.json")).read())
    assert (written["algo"], written["env_id"]) == ("dqn", "CartPole-v1") and written["config"]["min_replay_size"]
    replay = start("replay", "replay")
    wait_for(lambda: "serving on port" in replay.output(), 120, "replay serving", [replay])
    healthy("replay")
    learner = start("learner", "learner")
    wait_for(lambda: "serving on" in learner.output(), 180, "learner serving", [replay, learner])
    healthy("learner")
    actors = [start("actor", "actor", f"actor{i}") for i in range(2)]

    try:
        learner.proc.wait(timeout=360)
    except subprocess.TimeoutExpired:
        pytest.fail(f"learner did not finish within 360 s:\n{learner.output()[-3000:]}")
    assert learner.proc.returncode == 0, learner.output()[-3000:]
    run_dir = os.path.join(runs_dir, "compose-run")
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    assert summary["algo"] == "dqn" and summary["env_id"] == "CartPole-v1"
    assert summary["env_steps"] >= 3000
    # A finished run ends its actors cleanly, so `restart: on-failure` leaves them stopped.
    for a in actors:
        a.proc.wait(timeout=120)
        assert a.proc.returncode == 0, a.output()[-3000:]
    assert replay.stop() == 0, replay.output()[-3000:]
    assert os.listdir(os.path.join(run_dir, "replay")), "no Reverb checkpoint in RUN/replay"
