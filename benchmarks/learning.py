"""Learning quality and wall-clock of `rlfleet up` (BatchPPO), several seeds.

Runs the README's main job once per seed, reads each run's summary.json and
prints the final evaluation return (mean action, 10 episodes) and the
wall-clock per seed, their median, and the targets of issue 2: median final
return >= 1500 at 1M env steps on HalfCheetah-v5 (CleanRL PPO reports 1443,
OpenAI Baselines PPO2 1669) and <= 15 minutes per 1M env steps.

Usage:
    python benchmarks/learning.py --env HalfCheetah-v5 --total-steps 1000000 --seeds 0 1 2 \
        --out runs/bench-learning
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="HalfCheetah-v5")
    p.add_argument("--total-steps", type=int, default=1_000_000)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--config", default="default")
    p.add_argument("--out", default="runs/bench-learning")
    p.add_argument("--target-return", type=float, default=1500.0)
    p.add_argument("--target-minutes-per-million", type=float, default=15.0)
    p.add_argument("extra", nargs="*", help="more `rlfleet up` arguments after --")
    args = p.parse_args()

    rows = []
    for seed in args.seeds:
        logdir = os.path.join(args.out, f"{args.env}-seed{seed}")
        cmd = [sys.executable, "-m", "deploy.cli", "up", "--algo", "ppo", "--env", args.env,
               "--total-steps", str(args.total_steps), "--logdir", logdir, "--seed", str(seed),
               "--config", args.config, "--report-interval", "30", *args.extra]
        print("$", " ".join(cmd), flush=True)
        start = time.time()
        subprocess.run(cmd, check=True)
        with open(os.path.join(logdir, "summary.json")) as f:
            s = json.load(f)
        rows.append(dict(seed=seed, final_eval_return_mean=s["final_eval_return_mean"], env_steps=s["env_steps"],
                         learner_steps=s["learner_steps"], wall_seconds=time.time() - start,
                         minutes_per_million=(time.time() - start) / 60 / (s["env_steps"] / 1e6)))
        print(json.dumps(rows[-1]), flush=True)

    med_return = statistics.median(r["final_eval_return_mean"] for r in rows)
    med_minutes = statistics.median(r["minutes_per_million"] for r in rows)
    print(f"\n{'seed':>4} {'final eval return':>18} {'env steps':>10} {'wall min':>9} {'min/1M':>7}")
    for r in rows:
        print(f"{r['seed']:>4} {r['final_eval_return_mean']:>18.1f} {r['env_steps']:>10,} "
              f"{r['wall_seconds'] / 60:>9.1f} {r['minutes_per_million']:>7.1f}")
    print(f"median final eval return {med_return:.1f} (target >= {args.target_return:.0f}: "
          f"{'PASS' if med_return >= args.target_return else 'FAIL'})")
    print(f"median minutes per 1M env steps {med_minutes:.1f} (target <= {args.target_minutes_per_million:.0f}: "
          f"{'PASS' if med_minutes <= args.target_minutes_per_million else 'FAIL'})")
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(dict(env=args.env, total_steps=args.total_steps, config=args.config, runs=rows,
                       median_final_eval_return=med_return, median_minutes_per_million=med_minutes), f, indent=2)


if __name__ == "__main__":
    main()
