"""Load: one learner serving many actors. Latency of status and heartbeats, weights fan-out time,
the learner's CPU and memory, for N simulated actors beside one real actor.

A real replay server, learner and actor (`rlfleet replay / learner / actor`, loopback) train; N simulated
actors (`rlfleet.loadgen.simulated_actors`, in client processes of up to 128 each, every one on its own
connection) register, hold a weight stream and heartbeat once a second, as real actors do. Per N the script
polls GetStatus 5 times a second and samples the learner's CPU and resident memory every 5 s; the simulated
actors record their heartbeat and registration latencies and when each policy version reached them.

Weights: `mlp` is PPO on HalfCheetah-v5 (the main job's policy MLP and normalizer); `cnn` is DQN on
ALE/Pong-v5 (the Nature CNN Q-network, ~6.7 MB a version). The baseline, measured in the same run, is N = 0:
the same cluster with the real actor alone.

Targets at N = 512 with the MLP weights: GetStatus p99 < 100 ms; every actor holds a new version
within 1 s of its publication; learner memory flat over 5 minutes (`--soak-minutes`; compared from minute 1
to the end).

`--attach-run`: instead, a DQN CartPole-v1 run (`rlfleet up`) with 8 real actor processes and 200 simulated
actors attached at once; checks that it finishes, that every real actor's env steps are counted, that status
answers throughout, and records each real actor's memory.

Usage:
    python benchmarks/load.py --out benchmarks/results/load.json
    python benchmarks/load.py --attach-run --out benchmarks/results/load-attach.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import psutil
from local_cluster import LocalCluster  # benchmarks/ (this script's folder is on sys.path)

PER_PROCESS = 128  # simulated actors per client process
WEIGHTS = {
    "mlp": (["--algo", "ppo", "--env", "HalfCheetah-v5"], []),
    # The Atari preset publishes every 100 learner steps; --cnn-publish-every makes versions come faster.
    "cnn": (
        ["--algo", "dqn", "--env", "ALE/Pong-v5"]
        + ["--set", "min_replay_size=1000", "--set", "replay_size=20000", "--set", "eval_every_updates=1000000"],
        [],
    ),
}


def _pct(xs, q):
    return float(np.percentile(xs, q)) if len(xs) else math.nan


def _summary(xs) -> dict:
    """p50 / p99 / max (milliseconds) of latencies in seconds."""
    return {k: round(1000 * v, 2) for k, v in (("p50", _pct(xs, 50)), ("p99", _pct(xs, 99)), ("max", max(xs or [0])))}


class _StatusPoller(threading.Thread):
    """GetStatus 5 times a second on one channel; latencies in seconds, failures counted."""

    def __init__(self, address: str):
        super().__init__(daemon=True)
        from rlfleet.proto import rlfleet_pb2, rlfleet_pb2_grpc
        from rlfleet.proto.security import channel

        self.stub, self.req = rlfleet_pb2_grpc.LearnerStub(channel(address)), rlfleet_pb2.GetStatusRequest()
        self.latencies: list[float] = []
        self.failures = 0
        self.last = None
        self.stop = threading.Event()

    def run(self):
        while not self.stop.wait(0.2):
            t = time.perf_counter()
            try:
                self.last = self.stub.GetStatus(self.req, timeout=10)
                self.latencies.append(time.perf_counter() - t)
            except Exception:
                self.failures += 1


class _Sampler(threading.Thread):
    """The learner's CPU (% of one core over each 5 s) and resident memory (MB) every 5 s: [(t, cpu, mb)]."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.proc, self.rows, self.stop = psutil.Process(pid), [], threading.Event()
        self.proc.cpu_percent()

    def run(self):
        t0 = time.monotonic()
        while not self.stop.wait(5.0):
            self.rows.append((time.monotonic() - t0, self.proc.cpu_percent(), self.proc.memory_info().rss / 2**20))


def _simulated(
    address: str, n: int, seconds: float, workdir: str, nice: int = 0
) -> tuple[list[subprocess.Popen], list[str]]:
    procs, outs = [], []
    for first in range(0, n, PER_PROCESS):
        out = os.path.join(workdir, f"simulated-{n}-{first}.json")
        procs.append(
            subprocess.Popen(
                ["nice", "-n", str(nice), sys.executable, "-m", "rlfleet.loadgen.simulated_actors"]
                + ["--learner", address]
                + ["--actors", str(min(PER_PROCESS, n - first)), "--seconds", str(seconds)]
                + ["--first-index", str(first), "--out", out],
                stdout=subprocess.DEVNULL,
                start_new_session=True,
            )
        )
        outs.append(out)
    return procs, outs


def _stop_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def measure(cluster: LocalCluster, n: int, seconds: float, workdir: str, nice: int = 0) -> dict:
    """N simulated actors for `seconds` against the cluster's learner; the row of the results table."""
    from rlfleet.loadgen.simulated_actors import fan_out_seconds, read_stats, slow_during_stalls

    poller, sampler = _StatusPoller(cluster.learner_address), _Sampler(cluster.procs[1].pid)
    sims, outs = _simulated(cluster.learner_address, n, seconds, workdir, nice) if n else ([], [])
    poller.start()
    sampler.start()
    try:
        time.sleep(seconds + 2)
        for p in sims:
            p.wait(120)
    finally:
        _stop_all(sims)
        poller.stop.set()
        sampler.stop.set()
        poller.join()
        sampler.join()
    stats, stalls = read_stats(outs)
    by_version = fan_out_seconds(stats)
    fan_out = list(by_version.values())
    mem = [mb for t, _, mb in sampler.rows]
    after_1min = [mb for t, _, mb in sampler.rows if t >= 60] or mem
    return dict(
        simulated_actors=n,
        seconds=seconds,
        status_ms=_summary(poller.latencies),
        status_failures=poller.failures,
        heartbeat_ms=_summary([h for s in stats for h in s["heartbeat_s"]]),
        register_ms=_summary([s["register_s"] for s in stats if s["register_s"] is not None]),
        fan_out_ms=_summary(fan_out),
        versions_measured=len(fan_out),
        versions_over_1s=sum(t > 1.0 for t in fan_out),
        # of those, the versions during which a simulated actors' process stalled (its own delay, not the learner's)
        versions_over_1s_during_client_stall=slow_during_stalls(stats, stalls, by_version),
        client_loop_stalls=dict(count=len(stalls), max_s=max((late for _, late in stalls), default=0.0)),
        errors=sorted({e for s in stats for e in s["errors"]}),
        learner_cpu_percent=round(float(np.mean([c for _, c, _ in sampler.rows])), 1) if sampler.rows else None,
        learner_rss_mb=dict(
            first=round(mem[0], 1) if mem else None,
            after_1min=round(after_1min[0], 1) if mem else None,
            last=round(mem[-1], 1) if mem else None,
            growth_after_1min=round(mem[-1] - after_1min[0], 1) if mem else None,
        ),
        weights_bytes=cluster_weights_bytes(cluster),
        learner_rss_series=[(round(t), round(mb, 1)) for t, _, mb in sampler.rows],
    )


def cluster_weights_bytes(cluster: LocalCluster) -> int:
    """The size of one serialized weights message of the cluster's learner."""
    import grpc

    from rlfleet.proto import rlfleet_pb2, rlfleet_pb2_grpc
    from rlfleet.proto.arrays import GRPC_OPTIONS

    with grpc.insecure_channel(cluster.learner_address, options=GRPC_OPTIONS) as ch:
        stub = rlfleet_pb2_grpc.LearnerStub(ch)
        for msg in stub.StreamWeights(rlfleet_pb2.StreamWeightsRequest(actor_id=-1), timeout=30):
            return msg.ByteSize()
    return 0


def sweep(args) -> dict:
    results = {}
    workdir = tempfile.mkdtemp(prefix="rlfleet-load-")
    for kind in args.weights:
        common, actor_args = WEIGHTS[kind]
        if kind == "cnn" and args.cnn_publish_every:
            common = [*common, "--set", f"publish_every={args.cnn_publish_every}"]
        rows = []
        with LocalCluster(common) as cluster:
            cluster.add_actor(*actor_args)
            from rlfleet.deploy.status import get_status

            while get_status(cluster.learner_address, 5)["policy_version"] < 2:  # training, publishing
                time.sleep(1)
            for n in [0, *args.actors]:
                soak = kind == "mlp" and n == max(args.actors)
                seconds = args.soak_minutes * 60 if soak else args.seconds
                row = measure(cluster, n, seconds, workdir, args.client_nice)
                rows.append(row)
                print(_row_text(kind, row), flush=True)
        results[kind] = rows
    return results


def _row_text(kind: str, r: dict) -> str:
    return (
        f"{kind} N={r['simulated_actors']:4d} ({r['seconds']:.0f}s, {r['weights_bytes'] / 1e6:.2f} MB/version): "
        f"status p50/p99/max {r['status_ms']['p50']}/{r['status_ms']['p99']}/{r['status_ms']['max']} ms "
        f"({r['status_failures']} failed); heartbeat {r['heartbeat_ms']['p50']}/{r['heartbeat_ms']['p99']}/"
        f"{r['heartbeat_ms']['max']} ms; fan-out {r['fan_out_ms']['p50']}/{r['fan_out_ms']['p99']}/"
        f"{r['fan_out_ms']['max']} ms over {r['versions_measured']} versions ({r['versions_over_1s']} > 1 s, "
        f"{r['versions_over_1s_during_client_stall']} of them during a client stall; client stalls "
        f"{r['client_loop_stalls']}); "
        f"learner CPU {r['learner_cpu_percent']}%, RSS {r['learner_rss_mb']}; errors {r['errors']}"
    )


def attach_run(args) -> dict:
    """DQN CartPole-v1 with 8 real actors (`rlfleet up`) and 200 simulated actors attached at once."""
    from rlfleet.deploy.status import StatusError, get_status

    logdir = tempfile.mkdtemp(prefix="rlfleet-attach-")
    import portpicker

    port = portpicker.pick_unused_port()
    address = f"127.0.0.1:{port}"
    log = open(os.path.join(logdir, "up.log"), "w")
    up = subprocess.Popen(
        [sys.executable, "-m", "rlfleet.deploy.cli", "up", "--algo", "dqn", "--env", "CartPole-v1"]
        + ["--actors", str(args.real_actors), "--total-steps", str(args.total_steps), "--learner-port", str(port)]
        + ["--logdir", os.path.join(logdir, "run")],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    sims, outs = [], []
    latencies, failures, actor_mb, max_listed = [], 0, {}, 0
    listed, run_env_steps = {}, 0  # real actors' env steps as status showed them; the run's count
    try:
        while True:
            try:
                get_status(address, 2)
                break
            except StatusError:
                if up.poll() is not None:
                    raise SystemExit(open(log.name).read()[-3000:]) from None
                time.sleep(0.5)
        sims, outs = _simulated(address, args.attach, 36000, logdir, args.client_nice)  # until the run ends
        while up.poll() is None:
            t = time.perf_counter()
            try:
                st = get_status(address, 10)
                latencies.append(time.perf_counter() - t)
                max_listed = max(max_listed, len(st["actors"]))
                for a in st["actors"]:
                    if not a["host"].startswith("simulated-"):
                        listed[a["actor_id"]] = max(listed.get(a["actor_id"], 0), a["env_steps"])
                run_env_steps = max(run_env_steps, st["env_steps"])
            except StatusError:
                if up.poll() is None and not os.path.exists(os.path.join(logdir, "run", "summary.json")):
                    failures += 1
            for child in psutil.Process(up.pid).children():
                try:
                    if "actor" in child.cmdline():
                        tree = [child, *child.children(recursive=True)]
                        mb = sum(p.memory_info().rss for p in tree) / 2**20
                        actor_mb[child.pid] = max(actor_mb.get(child.pid, 0.0), mb)
                except psutil.Error:  # it just exited (the run is ending)
                    pass
            time.sleep(0.5)
    finally:
        _stop_all(sims)
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGTERM)
            up.wait(60)
    summary = json.load(open(os.path.join(logdir, "run", "summary.json")))
    per_actor = []
    for i in range(args.real_actors):  # each actor's own count, printed when it stops
        text = open(os.path.join(logdir, "run", "logs", f"actor-{i}.log")).read()
        per_actor += [int(n) for n in re.findall(r"actor-\d+\[\d+\] INFO stopped after (\d+) env steps", text)]
    from rlfleet.loadgen.simulated_actors import read_stats

    stats, _ = read_stats([out for out in outs if os.path.exists(out)])
    return dict(
        real_actors=args.real_actors,
        simulated_actors=args.attach,
        total_steps=args.total_steps,
        completed=summary["completed"],
        final_eval_return_mean=summary["final_eval_return_mean"],
        summary_env_steps=summary["env_steps"],
        real_actor_env_steps=per_actor,  # each actor's own count when it stopped
        real_actor_env_steps_in_status=sorted(listed.values()),  # the most status showed for each
        status_env_steps_max=run_env_steps,
        most_actors_listed=max_listed,
        status_ms=_summary(latencies),
        status_failures=failures,
        heartbeat_ms=_summary([h for s in stats for h in s["heartbeat_s"]]),
        simulated_errors=sorted({e for s in stats for e in s["errors"]}),
        actor_peak_rss_mb=sorted(round(v) for v in actor_mb.values()),
        wall_seconds=summary["wall_seconds"],
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--actors", type=int, nargs="+", default=[32, 128, 512], help="simulated actor counts")
    p.add_argument("--weights", nargs="+", default=["mlp", "cnn"], choices=sorted(WEIGHTS))
    p.add_argument("--seconds", type=float, default=60.0, help="seconds per measurement")
    p.add_argument("--soak-minutes", type=float, default=5.0, help="minutes of the largest N with the MLP weights")
    p.add_argument("--cnn-publish-every", type=int, default=0, help="learner steps per CNN version (0: preset, 100)")
    p.add_argument(
        "--client-nice",
        type=int,
        default=10,
        help="niceness of the simulated actors' processes: they stand in for other machines, so by default they "
        "yield the CPU to the learner, replay and real actor (0: compete on equal terms)",
    )
    p.add_argument("--attach-run", action="store_true", help="the DQN CartPole run with real + simulated actors")
    p.add_argument("--real-actors", type=int, default=8)
    p.add_argument("--attach", type=int, default=200, help="--attach-run: simulated actors")
    p.add_argument("--total-steps", type=int, default=60000, help="--attach-run: env steps")
    p.add_argument("--out", default=None, help="write the results here as JSON")
    args = p.parse_args()
    if args.attach_run:
        results = attach_run(args)
        print(json.dumps(results, indent=1))
    else:
        results = sweep(args)
    results["client_nice"] = args.client_nice
    results["command"] = " ".join(["python", "benchmarks/load.py", *sys.argv[1:]])
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
