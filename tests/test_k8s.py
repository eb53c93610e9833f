"""deploy/k8s: every kustomization renders with `kubectl kustomize`, validates strictly against the oldest and the
newest Kubernetes versions supported, and its pieces fit together: Service selectors and ports, the NetworkPolicy's
pods, volumes, the variables of every container's arguments, and the arguments themselves, parsed by rlfleet's own
command line after the init container's command has run as a local process. As root, the base's containers run as
local processes to a finished run (network namespaces for the pods, hosts files for the Service names).

No cluster runs here: nothing is applied. Skipped, with the reason, without kubectl (and without root, the
process test).
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time

import click
import pytest
import yaml
from helpers import ENV, ROOT, NsProc, two_machines, wait_for

from rlfleet.deploy.cli import main as rlfleet_cli

KUBECTL = shutil.which("kubectl")
K8S = os.path.join(ROOT, "deploy", "k8s")
TARGETS = ["base", "overlays/gpu", "overlays/publish", "overlays/remote-actors", "my-run"]
# A user's own overlay, as docs/running/kubernetes.md makes it: the image from a registry, a token of their own.
MY_RUN = """resources:
  - ../overlays/publish
secretGenerator:
  - name: rlfleet-token
    behavior: replace
    files:
      - token
images:
  - name: rlfleet
    newName: registry.example.com/rlfleet
    newTag: "0.1.0"
"""
KUBERNETES_VERSIONS = ["1.25.0", "1.37.0"]  # the oldest and the newest this project supports (docs say so)
_VAR = re.compile(r"\$\((\w+)\)")

pytestmark = pytest.mark.skipif(
    KUBECTL is None, reason="kubectl not installed (it renders deploy/k8s with its built-in kustomize)"
)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """{target: [rendered documents]}, rendered from a copy of deploy/k8s (remote-actors needs a token file)."""
    root = tmp_path_factory.mktemp("k8s") / "k8s"
    shutil.copytree(K8S, root)
    (root / "overlays" / "remote-actors" / "token").write_text("k8s-test-token")
    (root / "my-run").mkdir()
    (root / "my-run" / "kustomization.yaml").write_text(MY_RUN)
    (root / "my-run" / "token").write_text("k8s-test-token")
    out = {}
    for target in TARGETS:
        res = subprocess.run([KUBECTL, "kustomize", str(root / target)], capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, f"kubectl kustomize {target}:\n{res.stderr}"
        out[target] = [d for d in yaml.safe_load_all(res.stdout) if d]
    return out


def _validate(path, version):
    return subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", "--quiet", "-k", version, str(path)],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("target", TARGETS)
def test_every_kustomization_renders_and_validates_strictly(rendered, target, tmp_path):
    path = tmp_path / "rendered.yaml"
    path.write_text(yaml.safe_dump_all(rendered[target]))
    for version in KUBERNETES_VERSIONS:
        res = _validate(path, version)
        assert res.returncode == 0, f"{target} against Kubernetes {version}:\n{res.stdout}{res.stderr}"
    # The check can fail: a field no version knows is refused.
    docs = [dict(d) for d in rendered[target]]
    docs[0] = dict(docs[0], spec_typo={"replicas": 1})
    path.write_text(yaml.safe_dump_all(docs))
    assert _validate(path, KUBERNETES_VERSIONS[-1]).returncode != 0


def _by_kind(docs, kind):
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def _matches(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _pod_templates(docs):
    """{workload name: pod template} of every Job."""
    return {name: job["spec"]["template"] for name, job in _by_kind(docs, "Job").items()}


def test_services_and_the_network_policy_select_the_pods_that_serve_their_ports(rendered):
    docs = rendered["base"]
    pods = _pod_templates(docs)
    services = _by_kind(docs, "Service")
    assert set(services) == {"replay", "learner"}
    for name, svc in services.items():
        chosen = [p for p in pods.values() if _matches(svc["spec"]["selector"], p["metadata"]["labels"])]
        assert len(chosen) == 1, (name, svc["spec"]["selector"])
        ports = {p["name"]: p["containerPort"] for c in chosen[0]["spec"]["containers"] for p in c.get("ports", [])}
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in ports, (name, port, ports)
    (policy,) = _by_kind(docs, "NetworkPolicy").values()
    server = pods["rlfleet-server"]["metadata"]["labels"]
    actor = pods["rlfleet-actors"]["metadata"]["labels"]
    assert _matches(policy["spec"]["podSelector"]["matchLabels"], server)
    [replay_rule] = [r for r in policy["spec"]["ingress"] if {p["port"] for p in r["ports"]} == {8000}]
    sources = [s["podSelector"]["matchLabels"] for s in replay_rule["from"]]
    assert any(_matches(s, actor) for s in sources) and not any(_matches(s, server) for s in sources)
    # Every pod's volumes exist: its claims are the PVCs rendered beside it, its mounts name its volumes.
    claims = set(_by_kind(docs, "PersistentVolumeClaim"))
    for name, pod in pods.items():
        volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
        for v in volumes.values():
            assert v["persistentVolumeClaim"]["claimName"] in claims, (name, v)
        for c in pod["spec"].get("initContainers", []) + pod["spec"]["containers"]:
            assert {m["name"] for m in c.get("volumeMounts", [])} <= set(volumes), (name, c["name"])


def _environment(container, docs) -> dict:
    """The variables a container sees from its env and envFrom ConfigMaps (Secret values: a stand-in)."""
    maps = _by_kind(docs, "ConfigMap")
    env = {}
    for source in container.get("envFrom", []):
        env.update(maps[source["configMapRef"]["name"]]["data"])
    for e in container.get("env", []):
        env[e["name"]] = e.get("value", "secret-value")
    return env


def _expand(args, env):
    """Kubernetes' $(VAR) expansion of container arguments; every variable must be defined."""
    out = []
    for a in args:
        missing = [v for v in _VAR.findall(a) if v not in env]
        assert not missing, f"{a!r}: {missing} not defined for the container"
        out.append(_VAR.sub(lambda m: env[m.group(1)], a))
    return out


def _parse(args):
    """Parses `rlfleet ARGS` with rlfleet's click command line without running it (UsageError on a bad option)."""
    name, *rest = args
    cmd = rlfleet_cli.get_command(click.Context(rlfleet_cli), name)
    if cmd is None:
        raise click.UsageError(f"no such command {name!r}")
    cmd.make_context(name, list(rest))
    return name


@pytest.mark.parametrize("target", TARGETS)
def test_every_container_command_is_a_valid_rlfleet_command(rendered, target, tmp_path):
    """Each container's arguments, with /runs on a temporary folder, parse as an rlfleet command; the init
    container's `rlfleet settings` runs for real, to write the settings file the others read."""
    docs = rendered[target]
    runs = str(tmp_path / "runs")

    def local(args):
        return [runs + a[len("/runs") :] if a == "/runs" or a.startswith("/runs/") else a for a in args]

    seen = set()
    for pod in _pod_templates(docs).values():
        containers = pod["spec"].get("initContainers", []) + pod["spec"]["containers"]
        for c in containers:
            args = local(_expand(c["args"], _environment(c, docs)))
            seen.add(c["name"])
            if c in pod["spec"].get("initContainers", []):
                res = subprocess.run(
                    [sys.executable, "-m", "rlfleet.deploy.cli", *args],
                    cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120,
                )  # fmt: skip
                assert res.returncode == 0, f"init container {c['name']}: {res.stdout}{res.stderr}"
                continue
            try:
                assert _parse(args) == c["name"], (c["name"], args)
            except click.ClickException as e:
                pytest.fail(f"{target}: container {c['name']}: `rlfleet {' '.join(args)}`: {e.format_message()}")
            probe = c.get("readinessProbe", {}).get("exec", {}).get("command")
            if probe:
                assert probe[0] == "rlfleet" and _parse(probe[1:]) == "health", probe
    assert seen == ({"actor"} if target.endswith("remote-actors") else {"settings", "replay", "learner", "actor"})


def test_a_users_overlay_sets_the_token_and_the_image(rendered):
    docs = rendered["my-run"]
    (secret,) = _by_kind(docs, "Secret").values()
    assert "stringData" not in secret and secret["data"]["token"] == "azhzLXRlc3QtdG9rZW4="  # base64 of the file
    images = {c["image"] for p in _pod_templates(docs).values() for c in p["spec"]["containers"]}
    assert images == {"registry.example.com/rlfleet:0.1.0"}


def test_the_addresses_in_the_arguments_are_the_services(rendered):
    """Actors dial the learner Service; the learner tells them the replay Service; both talk to each other over
    the pod's localhost on the ports the Services forward to."""
    docs = rendered["base"]
    services = {n: s["spec"]["ports"][0] for n, s in _by_kind(docs, "Service").items()}
    pods = _pod_templates(docs)
    [actor] = pods["rlfleet-actors"]["spec"]["containers"]
    actor_args = _expand(actor["args"], _environment(actor, docs))
    assert actor_args[actor_args.index("--learner") + 1] == f"learner:{services['learner']['port']}"
    containers = {c["name"]: c for c in pods["rlfleet-server"]["spec"]["containers"]}
    learner = _expand(containers["learner"]["args"], _environment(containers["learner"], docs))
    replay = _expand(containers["replay"]["args"], _environment(containers["replay"], docs))
    assert learner[learner.index("--replay-for-actors") + 1] == f"replay:{services['replay']['port']}"
    port_of = {p["name"]: p["containerPort"] for c in containers.values() for p in c.get("ports", [])}
    assert learner[learner.index("--replay") + 1] == f"localhost:{port_of['replay']}"
    assert replay[replay.index("--learner") + 1] == f"localhost:{port_of['learner']}"
    assert int(learner[learner.index("--port") + 1]) == port_of["learner"]
    assert int(replay[replay.index("--port") + 1]) == port_of["replay"]


SERVER_IP, ACTORS_IP = "10.215.0.1", "10.215.0.2"


@pytest.mark.root
@pytest.mark.slow
def test_the_base_runs_as_local_processes_to_a_finished_run(rendered, tmp_path):
    """Every container of the base, with its own command, arguments and environment, as a local process: the
    server pod's in one network namespace, the actor pods' in another, the Service names resolving to the server
    pod's address (each namespace's hosts file) and /runs a temporary folder standing for the volume. The init
    container runs first, the kubelet's readiness probes are asked until they pass, and the run finishes: every
    process exits 0 and summary.json says completed."""
    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces)")
    docs = [dict(d) for d in rendered["base"]]
    (run_cm,) = _by_kind(docs, "ConfigMap").values()
    run_cm["data"] = dict(run_cm["data"], RLFLEET_TOTAL_STEPS="3000", RLFLEET_RUN="k8s-run")  # a short run
    token = "k8s-process-test-token"
    services = _by_kind(docs, "Service")
    pods = _pod_templates(docs)
    server, actors_job = pods["rlfleet-server"]["spec"], _by_kind(docs, "Job")["rlfleet-actors"]["spec"]
    # The Services forward their port to the same port of the pod, so a name resolving to the pod's address is
    # all a process needs.
    container_ports = {p["name"]: p["containerPort"] for c in server["containers"] for p in c.get("ports", [])}
    for svc in services.values():
        for port in svc["spec"]["ports"]:
            assert port["port"] == container_ports[port["targetPort"]], (svc["metadata"]["name"], port)
    runs = str(tmp_path / "runs")
    os.makedirs(runs)

    def command(container):
        env = _environment(container, docs)
        env.update({e["name"]: token for e in container.get("env", []) if "secretKeyRef" in e.get("valueFrom", {})})
        args = [runs + a[len("/runs") :] if a.startswith("/runs") else a for a in _expand(container["args"], env)]
        return args, dict(ENV, **env)

    started = []
    with two_machines({"server": SERVER_IP, "actors": ACTORS_IP}, hosts={n: "server" for n in services}) as ns:

        def start(role, name, container):
            args, env = command(container)
            p = NsProc(tmp_path, ns[role], name, *args, env=env)
            started.append(p)
            return p

        def probe(container):
            args = container["readinessProbe"]["exec"]["command"]
            cmd = ["ip", "netns", "exec", ns["server"], sys.executable, "-m", "rlfleet.deploy.cli", *args[1:]]
            res = subprocess.run(cmd, cwd=ROOT, env=command(container)[1], capture_output=True, timeout=60)
            return res.returncode == 0

        try:
            for init in server["initContainers"]:
                p = start("server", init["name"], init)
                assert p.proc.wait(120) == 0, p.output()
            procs = {c["name"]: start("server", c["name"], c) for c in server["containers"]}
            for c in server["containers"]:
                wait_for(lambda c=c: probe(c), 180, f"the {c['name']} container's readiness probe", procs.values())
            [actor] = actors_job["template"]["spec"]["containers"]
            for i in range(actors_job["parallelism"]):
                procs[f"actor-{i}"] = start("actors", f"actor-{i}", actor)
            deadline = time.monotonic() + 300
            while any(p.proc.poll() is None for p in procs.values()) and time.monotonic() < deadline:
                time.sleep(0.5)
            codes = {name: p.proc.poll() for name, p in procs.items()}
            assert codes == dict.fromkeys(procs, 0), {n: (c, procs[n].output()[-2000:]) for n, c in codes.items()}
        finally:
            for p in reversed(started):
                p.stop()
    run_dir = os.path.join(runs, "k8s-run")
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    assert summary["completed"] and summary["env_steps"] >= 3000 and summary["algo"] == "dqn", summary
    assert os.listdir(os.path.join(run_dir, "replay")), "no Reverb checkpoint on the volume"
    # Every actor pod registered (through the learner Service's name, from the other namespace).
    actor_ids = json.loads(open(os.path.join(run_dir, "actor_ids.json")).read())
    assert actor_ids["next_actor_id"] >= actors_job["parallelism"], actor_ids
