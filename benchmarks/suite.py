"""The learning suite: default presets on many tasks, several seeds, against published numbers and a peer.

`run` trains every (env, seed) that has no finished run directory yet, one at a time
(a run stopped half-way is continued with `rlfleet up --resume`), then prints the
report. `report` reads run directories and prints, per (algo, env): the final
evaluation return of each seed (BatchPPO: mean action; DQN: ε = 0.001; 10 episodes),
their median and interquartile mean (IQM) with stratified-bootstrap 95% confidence
intervals (rliable, Agarwal et al. 2021), the median wall-clock, and the published
target; for envs run by both rlfleet and the Stable-Baselines3 peer, the two side by
side. It also writes one learning-curve plot per env (evaluation return against env
steps, every seed of every algorithm).

Usage (from the repository root, with `pip install -e ".[cpu,report]"`, and ".[cpu,bench]" for the peer):
    python benchmarks/suite.py run --algo ppo --envs Hopper-v5 Walker2d-v5 --seeds 0 1 2 \
        --total-steps 1000000 --out runs/suite-ppo-1m
    python benchmarks/suite.py run --algo sb3-ppo --envs Hopper-v5 --seeds 0 1 2 --total-steps 300000 \
        --out runs/suite-sb3-300k
    python benchmarks/suite.py run --algo dqn --envs CartPole-v1 Acrobot-v1 --seeds 0 1 2 \
        --total-steps 100000 --out runs/suite-dqn
    python benchmarks/suite.py report runs/suite-ppo-1m runs/suite-sb3-300k --json benchmarks/results/suite.json \
        --plots benchmarks/results
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import shlex
import statistics
import subprocess
import sys
import time

import numpy as np
from report import finished, load_runs  # benchmarks/report.py (this script's folder is on sys.path)

from rlfleet.common.files import atomic_write

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Published final returns to meet or beat: (return, budget in env steps, source).
TARGETS = {
    ("ppo", "HalfCheetah-v5"): (2284.0, 1_000_000, "an earlier rlfleet default preset (CleanRL PPO: 1443)"),
    ("ppo", "Hopper-v5"): (2383.0, 1_000_000, "CleanRL PPO"),
    ("ppo", "Walker2d-v5"): (2288.0, 1_000_000, "CleanRL PPO"),
    ("ppo", "InvertedPendulum-v5"): (963.0, 1_000_000, "CleanRL PPO"),
    ("ppo", "Humanoid-v5"): (716.0, 1_000_000, "CleanRL PPO"),
    ("ppo", "Swimmer-v5"): (111.0, 1_000_000, "OpenAI Baselines PPO"),
    ("ppo", "InvertedDoublePendulum-v5"): (7103.0, 1_000_000, "OpenAI Baselines PPO"),
    ("ppo", "Reacher-v5"): (-6.7, 1_000_000, "OpenAI Baselines PPO"),
    ("ppo", "Ant-v5"): (1327.0, 1_000_000, "SB3 zoo PPO"),
    ("dqn", "CartPole-v1"): (475.0, 100_000, "near-solved (500 max), every seed"),
    ("dqn", "Acrobot-v1"): (-100.0, 100_000, "SB3 zoo tuned DQN (about -80)"),
    ("dqn", "MountainCar-v0"): (-120.0, 200_000, "SB3 zoo tuned DQN"),
}


def run_one(algo: str, env: str, seed: int, total_steps: int, logdir: str, extra: list[str]) -> None:
    """Trains one (env, seed) into `logdir` unless it already finished; continues a stopped one.

    Raises:
        SystemExit: the run failed (its output, above the message, says why); runs finished before it are kept.
    """
    summary = os.path.join(logdir, "summary.json")
    done = json.loads(open(summary).read()) if os.path.exists(summary) else None
    if done and finished(done, total_steps):
        print(f"# {logdir}: finished earlier, kept", flush=True)
        return
    if algo.startswith("sb3-"):
        cmd = [
            sys.executable,
            os.path.join(ROOT, "benchmarks", "sb3_peer.py"),
            "--algo",
            algo.removeprefix("sb3-"),
            "--env",
            env,
            "--seed",
            str(seed),
            "--total-steps",
            str(total_steps),
            "--logdir",
            logdir,
            *extra,
        ]
    else:
        cmd = [
            sys.executable,
            "-m",
            "rlfleet.deploy.cli",
            "up",
            "--algo",
            algo,
            "--env",
            env,
            "--total-steps",
            str(total_steps),
            "--seed",
            str(seed),
            "--report-interval",
            "1",
            *extra,
        ]  # a metrics row (with the latest evaluation: a curve point) per second
        cmd += ["--resume", logdir] if os.path.exists(os.path.join(logdir, "run.json")) else ["--logdir", logdir]
    print("$", shlex.join(cmd), flush=True)
    code = subprocess.run(cmd, cwd=ROOT).returncode
    if code:
        raise SystemExit(
            f"{logdir}: the run failed (exit status {code}; its output above says why). The runs finished before it "
            "are kept: fix the cause and give the same command again to go on."
        )


def load(dirs: list[str]) -> list[dict]:
    """Every finished run under `dirs` (a directory holding summary.json, or a folder of them)."""
    found = sorted(
        os.path.dirname(s)
        for d in dirs
        for s in glob.glob(os.path.join(glob.escape(d), "summary.json"))
        + glob.glob(os.path.join(glob.escape(d), "*", "summary.json"))
    )
    return [r for r in load_runs(found) if r["summary"].get("completed", True)]


def interval_estimates(returns: list[float], reps: int = 2000) -> dict:
    """Median and IQM of one env's per-seed returns with stratified-bootstrap 95% CIs (rliable)."""
    from rliable import library, metrics

    scores = {"x": np.asarray(returns, np.float64)[:, None]}
    # Median over seeds (rliable's aggregate_median is the median over tasks of the per-task mean).
    point, ci = library.get_interval_estimates(
        scores, lambda s: np.array([np.median(s[:, 0]), metrics.aggregate_iqm(s)]), reps=reps
    )
    return dict(
        median=float(point["x"][0]),
        median_ci95=[float(ci["x"][0][0]), float(ci["x"][1][0])],
        iqm=float(point["x"][1]),
        iqm_ci95=[float(ci["x"][0][1]), float(ci["x"][1][1])],
    )


def _budget(env_steps: int) -> int:
    """The budget a run was asked for: its env steps rounded down to 2 significant digits (runs overshoot
    the budget by less than 2%, an unroll of every env), e.g. 304,872 -> 300,000 and 1,003,520 -> 1,000,000."""
    unit = 10 ** max(0, len(str(int(env_steps))) - 2)
    return int(env_steps) // unit * unit


def report(runs: list[dict]) -> dict:
    """Per (algo, env, budget) statistics, targets and peer comparisons (see the module doc)."""
    groups = collections.defaultdict(list)
    for r in runs:
        s = r["summary"]
        budget = _budget(s["env_steps"])
        groups[(s["algo"], s["env_id"], budget)].append(r)
    out = {}
    for (algo, env, budget), rs in sorted(groups.items()):
        returns = [r["summary"]["final_eval_return_mean"] for r in rs]
        walls = [r["summary"]["wall_seconds"] for r in rs]
        row = dict(
            algo=algo,
            env=env,
            env_steps=budget,
            seeds=[r["summary"].get("seed") for r in rs],
            returns=returns,
            wall_seconds=walls,
            median_wall_seconds=statistics.median(walls),
            **interval_estimates(returns),
        )
        target = TARGETS.get((algo, env))
        if target and abs(target[1] - budget) <= 0.05 * target[1]:
            row["target"], row["target_source"] = target[0], target[2]
            row["meets_target"] = (min(returns) if algo == "dqn" and env == "CartPole-v1" else row["median"]) >= target[
                0
            ]
        out[f"{algo} {env} {budget}"] = row
    for row in out.values():  # rlfleet vs the peer at the same budget
        peer = out.get(f"sb3-{row['algo']} {row['env']} {row['env_steps']}")
        if row["algo"] in ("ppo", "dqn") and peer:
            row["peer"] = dict(
                median=peer["median"],
                median_wall_seconds=peer["median_wall_seconds"],
                return_at_least_peer=row["median"] >= peer["median"],
                wall_fraction=row["median_wall_seconds"] / peer["median_wall_seconds"],
            )
    return out


def plot(runs: list[dict], folder: str) -> list[str]:
    """One PNG per env: evaluation return against env steps for every run (matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"ppo": "tab:blue", "sb3-ppo": "tab:orange", "dqn": "tab:green", "sb3-dqn": "tab:red"}
    paths = []
    for env in sorted({r["summary"]["env_id"] for r in runs}):
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for r in runs:
            s = r["summary"]
            if s["env_id"] != env:
                continue
            pts = [
                (row["env_steps"], row["eval_return_mean"])
                for row in r["rows"]
                if row.get("eval_return_mean") is not None
            ]
            pts.append((s["env_steps"], s["final_eval_return_mean"]))
            label = "SB3 " + s["algo"][4:].upper() if s["algo"].startswith("sb3-") else "rlfleet " + s["algo"]
            ax.plot(
                *zip(*sorted(pts)), color=colors.get(s["algo"], "k"), alpha=0.8, label=f"{label} seed {s.get('seed')}"
            )
        ax.set_title(env)
        ax.set_xlabel("env steps")
        ax.set_ylabel("evaluation return")
        ax.legend(fontsize=6)
        fig.tight_layout()
        path = os.path.join(folder, f"suite-{env.replace('/', '-')}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def print_report(result: dict) -> None:
    print(
        f"\n{'algo':8} {'env':26} {'steps':>9} {'per-seed final return':>30} {'median [95% CI]':>28} "
        f"{'IQM':>8} {'wall s':>7}  target"
    )
    for row in result.values():
        seeds = " ".join(f"{x:.0f}" for x in row["returns"])
        ci = f"{row['median']:.1f} [{row['median_ci95'][0]:.0f}, {row['median_ci95'][1]:.0f}]"
        target = ""
        if "target" in row:
            target = f">= {row['target']:g} ({row['target_source']}): {'PASS' if row['meets_target'] else 'FAIL'}"
        print(
            f"{row['algo']:8} {row['env']:26} {row['env_steps']:>9,} {seeds:>30} {ci:>28} {row['iqm']:>8.1f} "
            f"{row['median_wall_seconds']:>7.0f}  {target}"
        )
        if "peer" in row:
            p = row["peer"]
            print(
                f"{'':8} {'vs SB3 PPO':26} {'':>9} {'':>30} {p['median']:>28.1f} {'':>8} "
                f"{p['median_wall_seconds']:>7.0f}  return >= peer: {'PASS' if p['return_at_least_peer'] else 'FAIL'}"
                f"; wall {p['wall_fraction']:.2f} of the peer's (target <= 0.33): "
                f"{'PASS' if p['wall_fraction'] <= 1 / 3 else 'FAIL'}"
            )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="train what is missing, then report")
    r.add_argument("--algo", choices=["ppo", "dqn", "sb3-ppo", "sb3-dqn"], required=True)
    r.add_argument("--envs", nargs="+", required=True)
    r.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    r.add_argument("--total-steps", type=int, required=True, help="env steps per run")
    r.add_argument("--out", required=True, help="folder of run directories ENV-sSEED")
    r.add_argument("extra", nargs="*", help="more arguments for `rlfleet up` (or sb3_peer.py), after --")
    rep = sub.add_parser("report", help="report on finished runs")
    rep.add_argument("dirs", nargs="+")
    for q in (r, rep):
        q.add_argument("--json", default=None, help="write the report as JSON here")
        q.add_argument("--plots", default=None, help="write one learning-curve PNG per env into this folder")
    args = p.parse_args()

    dirs = args.dirs if args.cmd == "report" else [args.out]
    if args.cmd == "run":
        for env in args.envs:
            for seed in args.seeds:
                start = time.monotonic()
                run_one(
                    args.algo,
                    env,
                    seed,
                    args.total_steps,
                    os.path.join(args.out, f"{env.replace('/', '-')}-s{seed}"),
                    args.extra,
                )
                print(f"# {env} seed {seed}: {time.monotonic() - start:.0f} s", flush=True)
    runs = load(dirs)
    result = report(runs)
    print_report(result)
    if args.json:
        atomic_write(args.json, json.dumps(result, indent=2))
    if args.plots:
        os.makedirs(args.plots, exist_ok=True)
        for path in plot(runs, args.plots):
            print("plot:", path)


if __name__ == "__main__":
    main()
