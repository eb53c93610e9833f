"""deploy/k8s: every kustomization renders with `kubectl kustomize`, validates strictly against the oldest and the
newest Kubernetes versions supported, and its pieces fit together: Service selectors and ports, the NetworkPolicy's
pods, volumes, the variables of every container's arguments, and the arguments themselves, parsed by rlfleet's own
command line after the init container's command has run as a local process.

No cluster runs here: nothing is applied. Skipped, with the reason, without kubectl.
"""

import os
import re
import shutil
import subprocess
import sys

import click
import pytest
import yaml
from helpers import ENV, ROOT

from rlfleet.deploy.cli import main as rlfleet_cli

KUBECTL = shutil.which("kubectl")
K8S = os.path.join(ROOT, "deploy", "k8s")
TARGETS = ["base", "overlays/gpu", "overlays/publish", "overlays/remote-actors"]
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
