"""Evaluation report over run directories: per-game returns, human-normalized scores, and the
interquartile mean (IQM) across runs with stratified-bootstrap 95% confidence intervals (rliable,
Agarwal et al. 2021), plus a learning-curve plot (evaluation return against env steps).

Runs are grouped by (algo, env); each run contributes its final evaluation return (the mean over
its `final_eval_episodes`, ε_eval = 0.001 for DQN/QDagger), or with `--at-env-steps N` its latest
evaluation at or before N env steps (to compare runs of different lengths at the same budget). Human-normalized score =
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

from rlfleet.analysis.runs_report import (  # noqa: F401  (the benchmarks import them from here too)
    MIN_COMPARED_RUNS,
    compare_with_ci,
    eval_points,
    eval_rows,
    iqm_with_ci,
    return_at,
)
from rlfleet.common.files import atomic_write, read_json_lines

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
    """summary.json (and metrics.jsonl rows) of each run directory, or a run record (`save_record`'s JSON file)
    in its place: {"dir": the path given, "summary": dict, "rows": list of metrics rows}, and for a record
    "extra": its other fields (command, ...).

    Raises:
        FileNotFoundError: a directory without summary.json (an unfinished run), or no such record.
    """
    runs = []
    for d in dirs:
        if d.endswith(".json"):
            record = read_record(d)
            extra = {k: v for k, v in record.items() if k not in ("run", "summary", "rows")}
            runs.append(dict(dir=d, summary=record["summary"], rows=record["rows"], extra=extra))
            continue
        with open(os.path.join(d, "summary.json")) as f:
            summary = json.load(f)
        rows = []
        if os.path.exists(os.path.join(d, "metrics.jsonl")):
            rows, _ = read_json_lines(os.path.join(d, "metrics.jsonl"))  # past a line a crash cut short
        runs.append(dict(dir=d, summary=summary, rows=rows))
    return runs


def read_record(path: str) -> dict:
    """A run record (`save_record`'s JSON file) as a dict with at least "summary" and "rows".

    Raises:
        FileNotFoundError: no such record.
        ValueError: the file is not a readable record (damaged, cut short, or not a record); the message names it.
    """
    with open(path) as f:
        text = f.read()
    try:
        record = json.loads(text)
        if not (isinstance(record.get("summary"), dict) and isinstance(record.get("rows"), list)):
            raise ValueError("no summary and rows")
    except (ValueError, AttributeError) as e:
        raise ValueError(
            f"{path}: not a readable run record ({e}); restore it (git checkout -- FILE) or delete it to run that "
            "run again"
        ) from None
    return record


def run_name(path: str) -> str:
    """A run's name: its directory's (or record's, without .json) base name."""
    name = os.path.basename(path.rstrip("/"))
    return name[: -len(".json")] if name.endswith(".json") else name


def finished(summary: dict, budget: int) -> bool:
    """Whether a run's summary says it completed a budget of at least `budget` env steps (a summary without
    `completed` is a finished run's: the peer's and older runs' say nothing else)."""
    return bool(summary.get("completed", True)) and summary["env_steps"] >= budget


def record_path(records: str, run_dir: str) -> str:
    """The path of the record of the run in `run_dir` in the folder `records` (RECORDS/RUN.json)."""
    return os.path.join(records, run_name(run_dir) + ".json")


def save_record(run: dict, path: str, row_fields: tuple[str, ...] = (), grid: int | None = None, **extra) -> None:
    """Writes a run record to `path`, atomically: the run's summary.json and one metrics row per evaluation (env
    steps, learner steps, evaluation return and, where the row has them, the evaluation's own env steps;
    `eval_points`), plus `extra` fields (e.g. the command); the other
    fields of a run read from a record, and of a record already at `path`, are kept unless given again. A record is
    a few KB and stands in for its run directory in `load_runs`, so results outlive the run directories
    (checkpoints and replay of a long Atari run are GBs and not kept); diagnostics on a grid make it tens of KB.

    `row_fields` are other metrics to keep (e.g. training diagnostics): on the evaluation rows, and, with `grid`
    (env steps), on each field's latest row at or before every multiple of `grid`, so that a metric read on that
    grid (each run's latest value at or before a point) reads the same from the record as from the run."""
    kept = {}
    if os.path.exists(path):
        kept = {k: v for k, v in read_record(path).items() if k not in ("run", "summary", "rows")}
    kept.update(run.get("extra", {}))
    kept.update(extra)
    rows = run["rows"]
    chosen = {id(r) for r in eval_rows(rows)}
    if grid and rows:
        for point in range(grid, rows[-1]["env_steps"] + grid, grid):
            for name in row_fields:
                seen = [r for r in rows if r["env_steps"] <= point and r.get(name) is not None]
                if seen:
                    chosen.add(id(seen[-1]))
    out = []
    for r in rows:
        if id(r) in chosen:
            row = dict(env_steps=r["env_steps"], learner_steps=r.get("learner_steps"))
            row.update({k: r[k] for k in ("eval_return_mean", "eval_env_steps", *row_fields) if r.get(k) is not None})
            out.append(row)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    atomic_write(path, json.dumps(dict(run=run_name(run["dir"]), **kept, summary=run["summary"], rows=out), indent=1))


def run_score(run: dict, at_env_steps: int | None = None, budget: int | None = None) -> float:
    """A run's score: its final evaluation return, or (`at_env_steps`) its latest evaluation at or before that
    many env steps. A run whose budget (`budget`, else summary.json's `total_steps`, else its env steps) is at
    most `at_env_steps` counts its final evaluation: a run stops a batch of env steps past its budget.

    Raises:
        ValueError: the run has no evaluation by then (name the run and the budget).
    """
    s = run["summary"]
    final = s.get("final_eval_return_mean")
    budget = budget or s.get("total_steps") or s["env_steps"]
    if at_env_steps is None or (final is not None and budget <= at_env_steps):
        score = final
    else:
        score = return_at(run["rows"], at_env_steps)
    if score is None:
        if at_env_steps is None:
            raise ValueError(f"{run['dir']}: no final evaluation; finish the run (rlfleet up ... --resume DIR)")
        raise ValueError(
            f"{run['dir']}: no evaluation by {at_env_steps:,} env steps; compare at a budget after its first "
            "evaluation, or let the run reach one (rlfleet up ... --resume DIR)"
        )
    return score


def report(runs: list[dict], at_env_steps: int | None = None, budgets: dict | None = None) -> dict:
    """Per (algo, env) returns and normalized scores; per algo the IQM across runs and games.

    Scores are final evaluation returns, or the returns at `at_env_steps` env steps (`run_score`, with each
    run's env-step budget from `budgets`, {run dir: env steps}, where given).

    Raises:
        ValueError: a run without an evaluation to score.
    """
    groups = collections.defaultdict(list)
    for r in runs:
        s = r["summary"]
        groups[(s["algo"], s["env_id"])].append(run_score(r, at_env_steps, (budgets or {}).get(r["dir"])))
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
    return dict(per_game=per_game, iqm=aggregates, at_env_steps=at_env_steps)


def plot(runs: list[dict], path: str, target: float | None = None, zoom_env_steps: int | None = None) -> None:
    """Evaluation return against env steps, one line per run (matplotlib, PNG); `target` draws a horizontal
    line at that return, and `zoom_env_steps` adds a second panel of the first that many env steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [None, zoom_env_steps] if zoom_env_steps else [None]
    fig, axes = plt.subplots(1, len(panels), figsize=(7 * len(panels), 4), squeeze=False)
    for ax, xmax in zip(axes[0], panels):
        for r in runs:
            pts = eval_points(r["rows"], xmax)
            if pts:
                s = r["summary"]
                name = run_name(r["dir"])
                ax.plot(*zip(*pts), marker=".", label=f"{s['algo']} {s['env_id']} ({name})")
        if target is not None:
            ax.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target:.1f}")
        ax.set_xlabel("env steps (agent steps)" + (f", first {xmax:,}" if xmax else ""))
        ax.set_ylabel("evaluation return")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def latest_returns(rows: list[dict], grid) -> list[float | None]:
    """The latest evaluation return at or before each env-step count of `grid` (None before the first)."""
    pts = eval_points(rows)
    out, i, latest = [], 0, None
    for x in grid:
        while i < len(pts) and pts[i][0] <= x:
            latest = pts[i][1]
            i += 1
        out.append(latest)
    return out


def _latest_until(rows: list[dict], grid, end: float) -> list[float]:
    """`latest_returns` as floats, NaN before the first evaluation and past `end` env steps."""
    return [np.nan if v is None or x > end else v for x, v in zip(grid, latest_returns(rows, grid))]


def plot_groups(runs: list[dict], path: str, target: float | None = None, max_env_steps: int | None = None) -> None:
    """Evaluation return against env steps, one line per algorithm: the median over its runs of each run's latest
    evaluation at or before each point (to the env steps all its runs reached), with the band between the
    runs' 25th and 75th percentiles (matplotlib, PNG, up to `max_env_steps`); `target` draws a horizontal line at
    that return."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[str, list[dict]] = {}
    for r in runs:
        groups.setdefault(r["summary"]["algo"], []).append(r)
    end = max_env_steps or max(r["summary"]["env_steps"] for r in runs)
    grid = np.linspace(0, end, 200)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for algo, members in groups.items():
        # To the env steps every run of the group has reached (no median of fewer runs at the end).
        common = min(r["summary"]["env_steps"] for r in members)
        curves = np.array([_latest_until(r["rows"], grid, common) for r in members])
        seen = ~np.all(np.isnan(curves), axis=0)
        median = np.nanmedian(curves[:, seen], axis=0)
        line = ax.plot(grid[seen], median, label=f"{algo} (median of {len(members)})")[0]
        low, high = np.nanpercentile(curves[:, seen], [25, 75], axis=0)
        ax.fill_between(grid[seen], low, high, color=line.get_color(), alpha=0.12, linewidth=0)
    if target is not None:
        ax.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target:.1f}")
    ax.set_xlabel("env steps (online, for students)")
    ax.set_ylabel("evaluation return (latest)")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", help="run directories (with summary.json), or run records (.json)")
    p.add_argument("--plot", default=None, help="write a learning-curve PNG here")
    p.add_argument("--out", default=None, help="write the report as JSON here")
    p.add_argument("--save-records", default=None, help="write each run's record (DIR/RUN.json) in this folder")
    p.add_argument(
        "--at-env-steps",
        type=int,
        default=None,
        help="score each run by its latest evaluation at or before this many env steps (default: its final one)",
    )
    args = p.parse_args()
    runs = load_runs(args.runs)
    if args.save_records:
        for r in runs:
            save_record(r, record_path(args.save_records, r["dir"]))
    try:
        result = report(runs, args.at_env_steps)
    except ValueError as e:
        raise SystemExit(f"report.py: {e}") from None
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
        atomic_write(args.out, json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
