"""An actor process's memory, and what N actors on one machine take together (Linux).

Starts `rlfleet up --actors N` (DQN on CartPole-v1 unless told otherwise), waits until every actor has sent env
steps, and reads each actor process's /proc/PID/smaps_rollup: resident (RSS), proportional (PSS: shared pages
split between the processes that map them) and private memory, and whether it maps TensorFlow's Python library
(an actor should not: it writes through `rlfleet.actors.replay_client`). Shared pages are mostly the libraries,
mapped from the same files by every actor on the machine, so N actors take about shared + N × private. In the same
run, for a baseline, it measures Python processes that import only what an actor needs besides Reverb's client
(numpy, grpc, gymnasium), then also Reverb's writer as an actor loads it, and, for comparison, TensorFlow and the
whole `reverb` package, which is what an actor took when it imported Reverb's client through the package.

Usage:
    python benchmarks/actor_memory.py --actors 4 --out benchmarks/results/actor-memory.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

# Imports measured for the baseline: what an actor needs besides Reverb's client, then Reverb's writer as an actor
# loads it; then TensorFlow and the whole reverb package instead.
IMPORTS = {
    "numpy, grpc, gymnasium": "import numpy, grpc, gymnasium",
    "+ Reverb's writer alone": "import numpy, grpc, gymnasium; from rlfleet.actors import replay_client; "
    "replay_client.load()",
    "+ tensorflow": "import numpy, grpc, gymnasium, tensorflow",
    "+ reverb": "import numpy, grpc, gymnasium, tensorflow, reverb",
}
TF_PYTHON_LIBRARY = "_pywrap_tensorflow_internal.so"  # what `import tensorflow` maps
REVERB_CLIENT_LIBRARY = "/reverb/libpybind.so"  # Reverb's compiled client
_MEASURE = (
    "import json; r = open('/proc/self/smaps_rollup').read().splitlines()[1:]; "
    "print(json.dumps({l.split(':')[0]: int(l.split()[1]) for l in r}))"
)


def memory_mb(fields: dict) -> dict:
    """RSS, PSS and private memory in MB from smaps_rollup fields (kB)."""
    private = fields["Private_Clean"] + fields["Private_Dirty"]
    return dict(rss_mb=fields["Rss"] / 1024, pss_mb=fields["Pss"] / 1024, private_mb=private / 1024)


def smaps(pid: int) -> dict:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        return {line.split(":")[0]: int(line.split()[1]) for line in f.read().splitlines()[1:]}


def maps_library(pid: int, name: str) -> bool:
    """Whether process `pid` maps a file whose path ends with `name`."""
    with open(f"/proc/{pid}/maps") as f:
        return any(line.rstrip().endswith(name) for line in f)


def children(parent: int, marker: str) -> list[int]:
    """PIDs of `parent`'s child processes whose command line holds `marker`."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == parent and marker in cmdline:
            out.append(int(name))
    return sorted(out)


def baseline() -> dict:
    """{what is imported: memory_mb} of fresh Python processes."""
    out = {}
    for label, imports in IMPORTS.items():
        res = subprocess.run(
            [sys.executable, "-c", f"{imports}; {_MEASURE}"],
            capture_output=True,
            text=True,
            timeout=300,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
        )
        out[label] = memory_mb(json.loads(res.stdout.strip().splitlines()[-1]))
    return out


def measure_actors(num_actors: int, algo: str, env_id: str, settle_s: float) -> list[dict]:
    """memory_mb of each actor of a running `rlfleet up`, `settle_s` seconds after all of them sent env steps."""
    from rlfleet.deploy.status import StatusError, get_status

    logdir = tempfile.mkdtemp(prefix="rlfleet-actor-memory-")
    port_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    up = subprocess.Popen(
        [sys.executable, "-m", "rlfleet.deploy.cli", "up", "--algo", algo, "--env", env_id, "--actors",
         str(num_actors), "--total-steps", str(10**9), "--logdir", os.path.join(logdir, "run")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=port_env, start_new_session=True,
    )  # fmt: skip
    try:
        address = None
        deadline = time.monotonic() + 300
        for line in up.stdout:  # "rlfleet up: learner at HOST:PORT (...)"
            if "learner at " in line:
                address = line.split("learner at ", 1)[1].split()[0]
                break
            if time.monotonic() > deadline:
                break
        if address is None:
            raise RuntimeError("rlfleet up did not say where its learner is")
        while True:
            try:
                st = get_status(address, 2)
                if len(st["actors"]) == num_actors and all(a["env_steps"] > 0 for a in st["actors"]):
                    break
            except StatusError:
                pass
            if time.monotonic() > deadline or up.poll() is not None:
                raise RuntimeError("the actors did not all send env steps within 300 s")
            time.sleep(1)
        time.sleep(settle_s)
        pids = children(up.pid, "rlfleet.deploy.cli actor")
        return [
            dict(
                pid=pid,
                tensorflow_python=maps_library(pid, TF_PYTHON_LIBRARY),
                reverb_client=maps_library(pid, REVERB_CLIENT_LIBRARY),
                **memory_mb(smaps(pid)),
            )
            for pid in pids
        ]
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGINT)
            try:
                up.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(up.pid, signal.SIGKILL)
                up.wait()
        shutil.rmtree(logdir, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--actors", type=int, default=4, help="actor processes (default 4)")
    p.add_argument("--algo", default="dqn")
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--settle", type=float, default=20.0, help="seconds of training before the reading")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args()
    base = baseline()
    actors = measure_actors(args.actors, args.algo, args.env, args.settle)
    mean = {k: sum(a[k] for a in actors) / len(actors) for k in ("rss_mb", "pss_mb", "private_mb")}
    shared = mean["rss_mb"] - mean["private_mb"]
    together = shared + len(actors) * mean["private_mb"]
    print("baseline (fresh Python processes)       RSS MB   PSS MB  private MB")
    for label, m in base.items():
        print(f"  {label:36s} {m['rss_mb']:7.0f} {m['pss_mb']:8.0f} {m['private_mb']:10.0f}")
    print(f"{len(actors)} actors of `rlfleet up --algo {args.algo} --env {args.env}`")
    for a in actors:
        tf_python = "TensorFlow's Python loaded" if a["tensorflow_python"] else "no TensorFlow Python"
        print(
            f"  actor pid {a['pid']:<28d} {a['rss_mb']:7.0f} {a['pss_mb']:8.0f} {a['private_mb']:10.0f}   {tf_python}"
        )
    print(
        f"per actor: {mean['rss_mb']:.0f} MB resident, {mean['private_mb']:.0f} MB its own; shared between them "
        f"about {shared:.0f} MB. {len(actors)} actors together: about {together:.0f} MB; each more: "
        f"{mean['private_mb']:.0f} MB ({1024 / mean['private_mb']:.1f} per GB beyond the shared part)."
    )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(baseline=base, actors=actors, mean=mean, shared_mb=shared, args=vars(args)), f, indent=1)


if __name__ == "__main__":
    main()
