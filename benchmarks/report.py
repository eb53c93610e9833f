"""Evaluation report over run directories: per-game returns, human-normalized scores, and the
interquartile mean (IQM) across runs with stratified-bootstrap 95% confidence intervals (rliable,
Agarwal et al. 2021), plus a learning-curve plot (evaluation return against env steps).

Runs are grouped by (algo, env); each run contributes its final evaluation return (the mean over
its `final_eval_episodes`, ε_eval = 0.001 for DQN/QDagger). Human-normalized score =
(return − random) / (human − random), with the published per-game random and human reference
scores (`REFERENCE_SCORES`, as tabulated with the Nature DQN results and in Dopamine); envs
without references are reported on raw returns.

Usage (needs `pip install -e ".[cpu,report]"`):
    python benchmarks/report.py runs/pong-dqn-s0 runs/pong-dqn-s1 runs/pong-qdagger-s0 --plot curves.png
"""

from __future__ import annotations

import argparse
import collections
import json
import os

import numpy as np

# env id -> (random policy score, human score).
REFERENCE_SCORES = {
    "ALE/Alien-v5": (227.8, 7127.7),
    "ALE/Asterix-v5": (210.0, 8503.3),
    "ALE/BeamRider-v5": (363.9, 16926.5),
    "ALE/Boxing-v5": (0.1, 12.1),
    "ALE/Breakout-v5": (1.7, 30.5),
    "ALE/Enduro-v5": (0.0, 860.5),
    "ALE/Freeway-v5": (0.0, 29.6),
    "ALE/MsPacman-v5": (307.3, 6951.6),
    "ALE/Pong-v5": (-20.7, 14.6),
    "ALE/Qbert-v5": (163.9, 13455.0),
    "ALE/Seaquest-v5": (68.4, 42054.7),
    "ALE/SpaceInvaders-v5": (148.0, 1668.7),
}


def human_normalized(env_id: str, score: float) -> float | None:
    """(score − random) / (human − random) for games with reference scores, else None."""
    if env_id not in REFERENCE_SCORES:
        return None
    random, human = REFERENCE_SCORES[env_id]
    return (score - random) / (human - random)


def load_runs(dirs: list[str]) -> list[dict]:
    """summary.json (and metrics.jsonl rows) of each run directory.

    Raises:
        FileNotFoundError: a directory without summary.json (an unfinished run).
    """
    runs = []
    for d in dirs:
        with open(os.path.join(d, "summary.json")) as f:
            summary = json.load(f)
        rows = []
        if os.path.exists(os.path.join(d, "metrics.jsonl")):
            with open(os.path.join(d, "metrics.jsonl")) as f:
                rows = [json.loads(line) for line in f]
        runs.append(dict(dir=d, summary=summary, rows=rows))
    return runs


def iqm_with_ci(scores: np.ndarray, reps: int = 2000) -> tuple[float, float, float]:
    """IQM of a [num_runs, num_games] score matrix and its stratified-bootstrap 95% CI (rliable)."""
    from rliable import library, metrics

    point, interval = library.get_interval_estimates(
        {"x": scores}, lambda s: np.array([metrics.aggregate_iqm(s)]), reps=reps
    )
    return float(point["x"][0]), float(interval["x"][0][0]), float(interval["x"][1][0])


def report(runs: list[dict]) -> dict:
    """Per (algo, env) returns and normalized scores; per algo the IQM across runs and games."""
    groups = collections.defaultdict(list)
    for r in runs:
        s = r["summary"]
        groups[(s["algo"], s["env_id"])].append(s["final_eval_return_mean"])
    per_game = {
        f"{algo} {env}": dict(
            returns=v, mean=float(np.mean(v)), runs=len(v), human_normalized=[human_normalized(env, x) for x in v]
        )
        for (algo, env), v in sorted(groups.items())
    }
    aggregates = {}
    for algo in sorted({a for a, _ in groups}):
        envs = sorted(e for a, e in groups if a == algo)
        counts = {len(groups[(algo, e)]) for e in envs}
        if len(counts) != 1:
            continue  # IQM over a run x game matrix needs the same number of runs per game
        normalized = all(e in REFERENCE_SCORES for e in envs)
        matrix = np.array([[human_normalized(e, x) if normalized else x for x in groups[(algo, e)]] for e in envs]).T
        point, low, high = iqm_with_ci(matrix)
        aggregates[algo] = dict(
            iqm=point,
            ci95=[low, high],
            runs=matrix.shape[0],
            games=envs,
            scale="human_normalized" if normalized else "return",
        )
    return dict(per_game=per_game, iqm=aggregates)


def plot(runs: list[dict], path: str) -> None:
    """Evaluation return against env steps, one line per run (matplotlib, PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in runs:
        pts = [
            (row["env_steps"], row["eval_return_mean"]) for row in r["rows"] if row.get("eval_return_mean") is not None
        ]
        if pts:
            s = r["summary"]
            ax.plot(*zip(*pts), label=f"{s['algo']} {s['env_id']} ({os.path.basename(r['dir'].rstrip('/'))})")
    ax.set_xlabel("env steps (agent steps)")
    ax.set_ylabel("evaluation return")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", help="run directories (with summary.json)")
    p.add_argument("--plot", default=None, help="write a learning-curve PNG here")
    p.add_argument("--out", default=None, help="write the report as JSON here")
    args = p.parse_args()
    runs = load_runs(args.runs)
    result = report(runs)
    for name, g in result["per_game"].items():
        norm = [x for x in g["human_normalized"] if x is not None]
        print(
            f"{name}: mean return {g['mean']:.1f} over {g['runs']} run(s)"
            + (f", human-normalized {np.mean(norm):.3f}" if norm else "")
        )
    for algo, a in result["iqm"].items():
        print(
            f"{algo}: IQM ({a['scale']}) {a['iqm']:.3f}, 95% CI [{a['ci95'][0]:.3f}, {a['ci95'][1]:.3f}] "
            f"over {a['runs']} run(s) x {len(a['games'])} game(s)"
        )
    if args.plot:
        plot(runs, args.plot)
        print(f"plot: {args.plot}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
