"""Soak: a replay server, a learner and many actors for minutes; no deadlock, flat memory, responsive status.

Runs real `rlfleet replay` / `learner` / `actor` processes on loopback (DQN on a
small env, each actor stepping its envs in-process), polls GetStatus twice a
second over one channel and records its latency, samples every process's
resident memory every 15 s and follows the replay table's insert and sample
counters. Prints, per minute, env steps and learner steps taken (both must
grow every minute after the warm-up: no deadlock), and at the end the GetStatus latency
percentiles, each process's memory at the start of the steady state against
the end, and the longest stretch in which the replay table saw no insert (or no
sample) at all: an upper bound on how long the rate limiter held everyone back
(Reverb 0.14 reports no wait times of its own).

Usage:
    python benchmarks/soak.py --actors 8 --minutes 10 --out benchmarks/results/soak.json
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import psutil
from local_cluster import LocalCluster  # benchmarks/ (this script's folder is on sys.path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--actors", type=int, default=8)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--steady-after", type=float, default=2.0, help="minutes of warm-up before memory is compared")
    p.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        help="KEY=VALUE for replay and learner, e.g. replay_size=20000 (a table that fills early)",
    )
    p.add_argument("--out", default=None, help="write the results here as JSON")
    args = p.parse_args()

    import grpc

    from rlfleet.proto import rlfleet_pb2, rlfleet_pb2_grpc
    from rlfleet.proto.security import channel

    sets = [a for kv in args.sets for a in ("--set", kv)]
    with LocalCluster(["--algo", "dqn", "--env", args.env, *sets]) as cluster:
        for _ in range(args.actors):
            cluster.add_actor("--env-backend", "sync")
        roles = ["replay", "learner"] + [f"actor-{i}" for i in range(args.actors)]
        procs = {role: psutil.Process(p.pid) for role, p in zip(roles, cluster.procs)}
        stub = rlfleet_pb2_grpc.LearnerStub(channel(cluster.learner_address))
        latencies, memory, minutes = [], [], []
        stalls = {k: dict(value=-1, since=time.monotonic(), longest=0.0) for k in ("inserts", "samples")}
        start = time.monotonic()
        next_mem = next_minute = start
        last = None
        while time.monotonic() - start < args.minutes * 60:
            t0 = time.perf_counter()
            try:
                st = stub.GetStatus(rlfleet_pb2.GetStatusRequest(), timeout=10)
            except grpc.RpcError as e:
                raise SystemExit(f"GetStatus failed: {e.code().name} {e.details()}") from e
            latencies.append(time.perf_counter() - t0)
            now = time.monotonic()
            table = next((t for t in st.replay if t.table == "dqn_replay"), None)
            for k, s in stalls.items():
                value = getattr(table, k) if table else s["value"]
                if value != s["value"]:
                    s["value"], s["since"] = value, now
                elif s["value"] > 0:  # after the first insert / sample
                    s["longest"] = max(s["longest"], now - s["since"])
            if now >= next_mem:
                next_mem += 15
                dead = [r for r, p in procs.items() if not p.is_running() or p.status() == psutil.STATUS_ZOMBIE]
                if dead:
                    raise SystemExit(f"processes died: {dead}")
                memory.append(dict(t=now - start, **{r: p.memory_info().rss / 2**20 for r, p in procs.items()}))
            if now >= next_minute:
                next_minute += 60
                row = dict(
                    minute=round((now - start) / 60),
                    env_steps=st.env_steps,
                    learner_steps=st.learner_steps,
                    actors=len(st.actors),
                )
                if last:
                    row.update(
                        d_env_steps=st.env_steps - last["env_steps"],
                        d_learner_steps=st.learner_steps - last["learner_steps"],
                    )
                    print(
                        f"minute {row['minute']:>3}: +{row['d_env_steps']:,} env steps, "
                        f"+{row['d_learner_steps']:,} learner steps, {row['actors']} actors",
                        flush=True,
                    )
                minutes.append(row)
                last = row
            time.sleep(max(0.0, 0.5 - (time.monotonic() - now)))

    lat_ms = np.array(latencies) * 1000
    steady = [m for m in memory if m["t"] >= args.steady_after * 60]
    mem = {
        r: dict(
            start_mib=round(steady[0][r], 1),
            end_mib=round(steady[-1][r], 1),
            growth_pct=round(100 * (steady[-1][r] / steady[0][r] - 1), 1),
        )
        for r in roles
    }
    progress = [m for m in minutes if "d_env_steps" in m and m["minute"] > args.steady_after]
    result = dict(
        env=args.env,
        actors=args.actors,
        minutes=args.minutes,
        settings=args.sets,
        status_calls=len(lat_ms),
        status_latency_ms=dict(
            p50=round(float(np.percentile(lat_ms, 50)), 2),
            p99=round(float(np.percentile(lat_ms, 99)), 2),
            max=round(float(lat_ms.max()), 2),
        ),
        every_minute_progressed=all(m["d_env_steps"] > 0 and m["d_learner_steps"] > 0 for m in progress),
        longest_stall_s={k: round(s["longest"], 1) for k, s in stalls.items()},
        memory=mem,
        per_minute=minutes,
    )
    print(
        f"\nGetStatus latency over {len(lat_ms)} calls: p50 {result['status_latency_ms']['p50']} ms, "
        f"p99 {result['status_latency_ms']['p99']} ms, max {result['status_latency_ms']['max']} ms"
    )
    print(f"env and learner steps grew in every minute after the warm-up: {result['every_minute_progressed']}")
    print(
        f"longest stretch without any replay insert: {result['longest_stall_s']['inserts']:.1f} s, "
        f"without any sample: {result['longest_stall_s']['samples']:.1f} s"
    )
    print(f"memory (MiB) from minute {args.steady_after:g} to the end:")
    for r, m in mem.items():
        print(f"  {r:<10} {m['start_mib']:>8.1f} -> {m['end_mib']:>8.1f}  ({m['growth_pct']:+.1f}%)")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
