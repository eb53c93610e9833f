"""Helpers for tests that run rlfleet services as real processes on loopback ports.

Imported as `helpers` (pyproject.toml puts tests/ on sys.path); the pytest fixtures built on them are in
conftest.py.
"""

import collections
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import types

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The environment of every rlfleet process a test starts, read-only: a test that needs more variables passes
# its own copy, e.g. `env=dict(ENV, RLFLEET_TOKEN="s3cret")`. rlfleet.* resolves through the installed package.
ENV = types.MappingProxyType(dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))


def rlfleet(*args, env=ENV, **kwargs):
    """Runs `python -m rlfleet.deploy.cli ARGS` in environment `env` to completion; returns CompletedProcess."""
    return subprocess.run(
        [sys.executable, "-m", "rlfleet.deploy.cli", *map(str, args)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        **kwargs,
    )


class Proc:
    """A background rlfleet service process, in environment `env`, whose output goes to a log file."""

    def __init__(self, tmp_path, name, *args, env=ENV):
        self.log_path = tmp_path / f"{name}.log"
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rlfleet.deploy.cli", *map(str, args)],
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output(self):
        return self.log_path.read_text(errors="replace")

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def wait_for(predicate, timeout, what, procs=()):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            assert p.proc.poll() is None, f"{what}: a process died:\n{p.output()[-3000:]}"
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def status_or_none(address, security=None, ready=True):
    """The learner's status at `address` (`security`: a `rlfleet.proto.security.ClientSecurity`, e.g. its token),
    or None while it does not answer, and with `ready` also while it is still starting (waiting for its settings
    or the replay server, `rlfleet.learner.status.STARTING_PHASES`): for `wait_for`."""
    from rlfleet.deploy.status import StatusError, get_status
    from rlfleet.learner.status import STARTING_PHASES

    try:
        st = get_status(address, 2, security)
    except StatusError:
        return None
    return None if ready and st["phase"] in STARTING_PHASES else st


def wait_for_status(read, pred, timeout, what, context=lambda: "", period=1.0):
    """Polls `read()` (a status dict, or None while the learner does not answer) until `pred(status)` holds, and
    returns that status; on timeout fails with the last status and `context()` (e.g. the engine's logs)."""
    deadline, st = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        st = read()
        if st is not None and pred(st):
            return st
        time.sleep(period)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last status {st}\n{context()}")


def start_replay_and_learner(procs, free_port, settings, logdir, *learner_args):
    """Starts `rlfleet replay` and `rlfleet learner` (never-ending budget) with the same `settings` (--algo,
    --env, --set ...) on free loopback ports; returns (replay, learner, learner address). The caller waits
    for the learner; `learner_args` go to the learner only. The replay server's port is `replay.port`."""
    replay_port, learner_port = free_port(), free_port()
    replay = procs.start("replay", "replay", *settings, "--port", replay_port)
    replay.port = replay_port
    learner = procs.start(
        "learner",
        "learner",
        *settings,
        "--replay",
        f"127.0.0.1:{replay_port}",
        "--logdir",
        logdir,
        "--port",
        learner_port,
        "--total-steps",
        10**7,
        *learner_args,
    )
    return replay, learner, f"127.0.0.1:{learner_port}"


def _ip(*args):
    out = subprocess.run(["ip", *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed: {out.stderr.strip()} (this test needs root and iproute2)")


@contextlib.contextmanager
def two_machines(ips: dict, hosts: dict | None = None):
    """Two network namespaces, the test's own "machines", joined by a veth pair on private addresses.

    Args:
        ips: {role: IPv4 address} for exactly two roles, e.g. {"cluster": "10.213.0.1", "actor": "10.213.0.2"}
            (a /24 between them).
        hosts: {host name: role}: names that resolve to that role's address inside both namespaces (through
            /etc/netns/NS/hosts, which `ip netns exec` mounts over /etc/hosts).
    Yields {role: namespace name}; the namespaces, the veth pair and the hosts files are removed at the end.
    Raises RuntimeError when `ip` fails (no root, no iproute2).
    """
    tag = f"rlf{os.getpid() % 100000}{len(ips)}"
    names = {role: f"{tag}{role[:3]}" for role in ips}
    (a, ip_a), (b, ip_b) = ips.items()
    try:
        for ns in names.values():
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            if hosts:
                os.makedirs(f"/etc/netns/{ns}", exist_ok=True)
                lines = ["127.0.0.1 localhost", *(f"{ips[role]} {name}" for name, role in hosts.items())]
                with open(f"/etc/netns/{ns}/hosts", "w") as f:
                    f.write("\n".join(lines) + "\n")
        _ip("link", "add", f"{tag}v{a[:2]}", "type", "veth", "peer", "name", f"{tag}v{b[:2]}")
        for role, ip in ((a, ip_a), (b, ip_b)):
            dev = f"{tag}v{role[:2]}"
            _ip("link", "set", dev, "netns", names[role])
            _ip("-n", names[role], "addr", "add", f"{ip}/24", "dev", dev)
            _ip("-n", names[role], "link", "set", dev, "up")
        yield names
    finally:
        for ns in names.values():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)


class NsProc:
    """An rlfleet command (`args`, without the leading `rlfleet`) running inside network namespace `ns`, in its
    own process group, environment `env`, output to a log file."""

    def __init__(self, tmp_path, ns, name, *args, env=ENV):
        self.log_path = tmp_path / f"{name}.log"
        self.log = open(self.log_path, "wb")
        cmd = ["ip", "netns", "exec", ns, sys.executable, "-m", "rlfleet.deploy.cli", *map(str, args)]
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def output(self):
        return self.log_path.read_text(errors="replace")

    def stop(self, sig=signal.SIGTERM):
        stop_group(self.proc, sig)
        self.log.close()


def tensorboard_scalars(tb_dir) -> collections.Counter:
    """(step, tag, float32 value) of every scalar in tb_dir's event files (not its subfolders), counted."""
    import tensorflow as tf

    found = collections.Counter()
    for events in tb_dir.glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(events)):
            for v in event.summary.value:
                found[(event.step, v.tag, float(tf.make_ndarray(v.tensor)))] += 1
    return found


def rows_as_scalars(rows) -> collections.Counter:
    """What MetricsLog should have written to TensorBoard for `rows` (dicts as written, or as read back from
    metrics.jsonl): (env_steps, field, float32 value) for each number but "time" and "env_steps", NaN and null
    left out, counted as `tensorboard_scalars` counts them."""
    return collections.Counter(
        (row["env_steps"], tag, float(np.float32(value)))
        for row in rows
        for tag, value in row.items()
        if tag not in ("time", "env_steps") and isinstance(value, (int, float)) and not np.isnan(value)
    )


def stop_group(proc: subprocess.Popen, sig=signal.SIGTERM, timeout=30) -> None:
    """Sends `sig` to the process group `proc` leads (started with start_new_session), waits up to `timeout`
    seconds, then kills the group."""
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def run_checked(*cmd, env=None, timeout=300, check=True, stdin=None) -> subprocess.CompletedProcess:
    """Runs `cmd` (str() of each part) in the repository root; with `check`, asserts exit status 0 and shows its
    output's tail otherwise. For the engine tests' docker, docker-compose and ip commands."""
    res = subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT, input=stdin
    )
    if check:
        shown = " ".join(map(str, cmd))
        assert res.returncode == 0, f"{shown} failed ({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res


def docker_engine_problem(tools) -> str | None:
    """Why the tests that run a Docker engine cannot run here (a tool of `tools` missing, or no engine answers
    DOCKER_HOST), or None."""
    missing = [t for t in tools if not shutil.which(t)]
    if missing:
        return f"{', '.join(missing)} not installed (.ci/run installs Debian's docker.io, docker-compose, mmdebstrap)"
    res = subprocess.run(
        ["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True, timeout=60
    )
    if res.returncode != 0:
        return f"no Docker engine answers ({res.stderr.strip()[:300]}); .ci/run starts a private dockerd as root"
    return None


# Runs in a fresh process in which rlfleet cannot be imported: what an exported policy's user has.
_LOAD_SAVEDMODEL = """
import sys
import numpy as np
sys.modules["rlfleet"] = None
import tensorflow as tf
serve = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
out = serve(observations=tf.constant(np.load(sys.argv[2])))
np.savez(sys.argv[3], **{k: v.numpy() for k, v in out.items()})
"""

_LOAD_ONNX = """
import sys
import numpy as np
sys.modules["rlfleet"] = sys.modules["tensorflow"] = None
import onnxruntime
session = onnxruntime.InferenceSession(sys.argv[1])
names = [o.name for o in session.get_outputs()]
out = session.run(names, {"observations": np.load(sys.argv[2])})
np.savez(sys.argv[3], **dict(zip(names, out)))
"""


def run_exported(tmp_path, fmt: str, model: str, observations: np.ndarray) -> dict:
    """The exported model's outputs on `observations`, computed by a fresh process without rlfleet (ONNX: nor
    TensorFlow)."""
    obs_path, out_path = tmp_path / "obs.npy", tmp_path / "out.npz"
    np.save(obs_path, observations)
    script = _LOAD_ONNX if fmt == "onnx" else _LOAD_SAVEDMODEL
    done = subprocess.run(
        [sys.executable, "-c", script, model, obs_path, out_path], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    with np.load(out_path) as out:
        return dict(out)
