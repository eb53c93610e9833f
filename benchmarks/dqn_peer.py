"""rlfleet's DQN against Stable-Baselines3's single-process DQN on one machine, end to end: wall-clock to the
budget and to a return threshold, and the final return, over several seeds.

`run` trains every (system, seed) of one batch that has no finished run directory yet, one at a time, in an
order shuffled once (`--order-seed`), so that the machine's load falls on both systems alike: rlfleet with
`rlfleet up` (replay, learner and one actor as local processes, the `default` preset) and the peer with
`benchmarks/sb3_peer.py --algo dqn` (SB3 2.9.2's DQN with the same preset wherever SB3 has the setting). Each
run's whole process is timed (start-up of every process included), and the CPU seconds of all its processes
counted, into RUN/process.json. `report` prints and writes, per system: the final evaluation return (10
episodes), the whole process's wall-clock to the budget and its CPU seconds, the training wall-clock to the
threshold (the first evaluation at or above it, each system's own training clock: rlfleet's learner from its
start, the peer's without the time its evaluations took), each as the median and IQM over seeds with
stratified-bootstrap 95% CIs (rliable), and rlfleet's medians as a fraction of the peer's.

Usage (with `pip install -e ".[cpu,report,bench]"`):
    python benchmarks/dqn_peer.py run --env CartPole-v1 --seeds 0 1 2 3 4 --total-steps 50000 --out runs/dqn-peer
    python benchmarks/dqn_peer.py report runs/dqn-peer --env CartPole-v1 --threshold 475 --json results.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import time

from report import finished, load_runs  # benchmarks/report.py (this script's folder is on sys.path)
from suite import interval_estimates, run_one

from rlfleet.deploy.files import atomic_write

SYSTEMS = ("dqn", "sb3-dqn")
# The peer's evaluations: as many as rlfleet's progress rows show, a few per run, each 10 episodes (its own
# evaluation time is left out of its training clock, so this costs it nothing in the comparison).
PEER_EVAL_EVERY = 2500


def run_dir(out: str, system: str, env: str, seed: int) -> str:
    """The run directory of (system, env, seed) in `out`."""
    return os.path.join(out, f"{system}-{env.replace('/', '_')}-s{seed}")


def run(env: str, seeds: list[int], total_steps: int, out: str, order_seed: int) -> None:
    """Trains the batch's runs that did not finish yet, in the shuffled order (module doc)."""
    batch = [(system, seed) for system in SYSTEMS for seed in seeds]
    random.Random(order_seed).shuffle(batch)
    for system, seed in batch:
        logdir = run_dir(out, system, env, seed)
        summary = os.path.join(logdir, "summary.json")
        if os.path.exists(summary) and finished(json.load(open(summary)), total_steps):
            continue
        extra = ["--eval-every", str(PEER_EVAL_EVERY)] if system.startswith("sb3-") else []
        start, cpu = time.monotonic(), _children_cpu_seconds()
        run_one(system, env, seed, total_steps, logdir, extra)
        measured = dict(process_wall_seconds=time.monotonic() - start, cpu_seconds=_children_cpu_seconds() - cpu)
        atomic_write(os.path.join(logdir, "process.json"), json.dumps(measured))


def _children_cpu_seconds() -> float:
    """User + system CPU seconds of every process this one started and waited for, their own children (waited
    for by them) included: a run's processes, summed over all of them."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _first_at(rows: list[dict], threshold: float) -> float | None:
    """The training wall-clock of the first metrics row whose evaluation return is at or above `threshold`."""
    for row in rows:
        value = row.get("eval_return_mean")
        if value is not None and value >= threshold:
            return float(row["wall_seconds"])
    return None


def report(out: str, env: str, threshold: float) -> dict:
    """{system: {finals, process_wall_seconds, seconds_to_threshold, and their estimates}, "ratios": ...}."""
    result = {}
    for system in SYSTEMS:
        dirs = sorted(d for d in os.listdir(out) if d.startswith(f"{system}-{env.replace('/', '_')}-s"))
        runs = load_runs([os.path.join(out, d) for d in dirs])
        finals, walls, cpus, to_threshold, never = [], [], [], [], 0
        for d, r in zip(dirs, runs):
            with open(os.path.join(out, d, "process.json")) as f:
                process = json.load(f)
            walls.append(process["process_wall_seconds"])
            if "cpu_seconds" in process:  # records of runs made before it was measured have none
                cpus.append(process["cpu_seconds"])
            finals.append(float(r["summary"]["final_eval_return_mean"]))
            t = _first_at(r["rows"], threshold)
            never += t is None
            to_threshold.append(t if t is not None else float(r["summary"]["wall_seconds"]))
        result[system] = dict(
            runs=dirs,
            final_eval_return=finals,
            final=interval_estimates(finals),
            process_wall_seconds=walls,
            process_wall=interval_estimates(walls),
            cpu_seconds=cpus,
            cpu=interval_estimates(cpus) if len(cpus) == len(walls) else None,
            seconds_to_threshold=to_threshold,
            to_threshold=interval_estimates(to_threshold),
            never_reached_threshold=never,
        )
    a, b = result["dqn"], result["sb3-dqn"]
    result["ratios"] = dict(
        process_wall=statistics.median(a["process_wall_seconds"]) / statistics.median(b["process_wall_seconds"]),
        to_threshold=statistics.median(a["seconds_to_threshold"]) / statistics.median(b["seconds_to_threshold"]),
        cpu=statistics.median(a["cpu_seconds"]) / statistics.median(b["cpu_seconds"])
        if a["cpu"] and b["cpu"]
        else None,
    )
    result.update(env=env, threshold=threshold)
    return result


def _estimate(e: dict, fmt: str) -> str:
    """'median M, IQM I [low, high]' of an `interval_estimates` result, each number as `fmt` formats it."""
    low, high = e["iqm_ci95"]
    return f"median {fmt.format(e['median'])}, IQM {fmt.format(e['iqm'])} [{fmt.format(low)}, {fmt.format(high)}]"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--env", required=True)
    r.add_argument("--seeds", type=int, nargs="+", required=True)
    r.add_argument("--total-steps", type=int, required=True, help="env steps per run")
    r.add_argument("--out", required=True, help="folder of the run directories")
    r.add_argument("--order-seed", type=int, default=0, help="seeds the shuffled order of the runs")
    q = sub.add_parser("report")
    q.add_argument("out", help="the folder `run` wrote")
    q.add_argument("--env", required=True)
    q.add_argument("--threshold", type=float, required=True, help="the return whose first evaluation is timed")
    q.add_argument("--json", default=None, help="write the report here")
    args = p.parse_args()
    if args.command == "run":
        run(args.env, args.seeds, args.total_steps, args.out, args.order_seed)
        return
    res = report(args.out, args.env, args.threshold)
    for system in SYSTEMS:
        s = res[system]
        print(f"{system} ({len(s['runs'])} seeds)")
        print(f"  final eval return: {_estimate(s['final'], '{:.1f}')}")
        print(f"  whole process wall-clock to the budget (s): {_estimate(s['process_wall'], '{:.1f}')}")
        if s["cpu"]:
            print(f"  CPU seconds, all its processes: {_estimate(s['cpu'], '{:.1f}')}")
        print(
            f"  training wall-clock to {res['threshold']:g} (s): {_estimate(s['to_threshold'], '{:.1f}')}"
            f" ({s['never_reached_threshold']} never reached it: their whole training time counted)"
        )
    cpu = f", CPU seconds {res['ratios']['cpu']:.2f}x" if res["ratios"]["cpu"] else ""
    print(f"rlfleet / SB3, medians: whole process {res['ratios']['process_wall']:.2f}x, to the threshold "
          f"{res['ratios']['to_threshold']:.2f}x{cpu}")  # fmt: skip
    if args.json:
        atomic_write(args.json, json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
