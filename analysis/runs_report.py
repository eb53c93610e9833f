"""Statistics over run directories, for `rlfleet report` and the benchmarks: IQMs and comparisons with
stratified-bootstrap 95% confidence intervals (rliable, Agarwal et al. 2021, "Deep Reinforcement Learning at the
Edge of the Statistical Precipice"), evaluation curves from metrics.jsonl, and the report of a group of seeds.

rliable and matplotlib come with the `report` extra; the functions import them when called.
"""

from __future__ import annotations

import json
import os
import re

import numpy as np

from rlfleet.common.files import read_json_lines


def iqm_with_ci(scores: np.ndarray, reps: int = 2000) -> tuple[float, float, float]:
    """IQM of a [num_runs, num_games] score matrix and its stratified-bootstrap 95% CI (rliable)."""
    from rliable import metrics

    return tuple(_estimate(scores, lambda s: np.array([metrics.aggregate_iqm(s)]), reps))


def _estimate(scores, func, reps: int) -> list[float]:
    """[point, low, high] of `func` (one value) over `scores` (`_estimates`)."""
    point, low, high = _estimates(scores, func, reps)
    return [float(point[0]), float(low[0]), float(high[0])]


def _estimates(scores, func, reps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(point, low, high) arrays of `func` over `scores` (a score matrix, or a list of two for a comparison, which
    `func` takes as two arguments; `func` returns an array) with rliable's stratified-bootstrap 95% CI, seeded so
    that a report repeats."""
    from rliable import library

    # rliable's stratified bootstraps draw their indices from numpy's global generator (np.random.choice), not
    # from a random_state they are given (arch only warns that it is deprecated): seed the global one for the
    # call, and leave the caller's state as it was.
    saved = np.random.get_state()
    np.random.seed(0)
    try:
        point, interval = library.get_interval_estimates({"x": scores}, func, reps=reps)
    finally:
        np.random.set_state(saved)
    return np.asarray(point["x"]), np.asarray(interval["x"][0]), np.asarray(interval["x"][1])


MIN_COMPARED_RUNS = 3  # runs a side below which compare_with_ci's bootstrap CIs say nothing


def compare_with_ci(scores_x: np.ndarray, scores_y: np.ndarray, reps: int = 2000) -> dict:
    """How runs X compare with runs Y on one task, each a 1-D array of final returns (any number of runs each),
    with stratified-bootstrap 95% CIs (rliable, Agarwal et al. 2021, Sec. 4):
    `probability_of_improvement`: [P(X > Y), low, high], the chance that a run of X beats a run of Y (0.5: no
    difference; scale-free); `iqm_difference`: [IQM(X) − IQM(Y), low, high] in return units; `iqm_ratio`:
    [IQM(X) / IQM(Y), low, high], or None where a run of Y returned ≤ 0 (a bootstrap IQM of Y could be 0).
    A CI that excludes 0.5 (difference: 0; ratio: 1) is a difference the runs establish, given enough runs: with
    few a side the bootstrap CI is coarse (three runs of X all above three of Y give [1, 1, 1], where the exact
    Mann-Whitney p is 0.05), so callers compare at least `MIN_COMPARED_RUNS` a side and CIs from fewer than five
    a side are rough. The bootstrap is seeded: a report gives the same CIs every time."""
    from rliable import metrics

    x = np.asarray(scores_x, dtype=float).reshape(-1, 1)
    y = np.asarray(scores_y, dtype=float).reshape(-1, 1)
    funcs = {
        "probability_of_improvement": lambda a, b: np.array([metrics.probability_of_improvement(a, b)]),
        "iqm_difference": lambda a, b: np.array([metrics.aggregate_iqm(a) - metrics.aggregate_iqm(b)]),
    }
    if (y > 0).all():
        funcs["iqm_ratio"] = lambda a, b: np.array([metrics.aggregate_iqm(a) / metrics.aggregate_iqm(b)])
    out = {"iqm_ratio": None}
    for name, func in funcs.items():
        out[name] = _estimate([x, y], func, reps)
    return out


def return_at(rows: list[dict], env_steps: int) -> float | None:
    """The latest evaluation return in metrics rows at or before `env_steps` env steps (None: none yet)."""
    values = [
        r["eval_return_mean"] for r in rows if r["env_steps"] <= env_steps and r.get("eval_return_mean") is not None
    ]
    return values[-1] if values else None


def eval_rows(rows: list[dict]) -> list[dict]:
    """The metrics rows that report a new evaluation: rows repeat the latest evaluation until the next, so
    each value is placed at the first row that reports it (a repeat of the same value is not told apart)."""
    out = []
    for row in rows:
        value = row.get("eval_return_mean")
        if value is not None and (not out or out[-1]["eval_return_mean"] != value):
            out.append(row)
    return out


def eval_points(rows: list[dict], max_env_steps: int | None = None) -> list[tuple[int, float]]:
    """(env steps, evaluation return) per evaluation (`eval_rows`), up to `max_env_steps` when given."""
    return [
        (r["env_steps"], r["eval_return_mean"])
        for r in eval_rows(rows)
        if max_env_steps is None or r["env_steps"] <= max_env_steps
    ]


def _read_json(path: str):
    """The JSON value in the file `path`."""
    with open(path) as f:
        return json.load(f)


def load_run(run_dir: str) -> dict:
    """A run directory as the report reads it: {"dir", "run" (run.json), "summary" (summary.json, None while
    unfinished), "rows" (metrics.jsonl rows)}.

    Raises:
        ValueError: no readable run.json (not a run directory).
    """
    try:
        run = _read_json(os.path.join(run_dir, "run.json"))
    except (OSError, ValueError) as e:
        raise ValueError(f"{run_dir}: not a run directory (run.json: {e}).") from None
    try:
        summary = _read_json(os.path.join(run_dir, "summary.json"))
    except (OSError, ValueError):
        summary = None
    try:  # a line a crash cut short is skipped; the rows after it (a resumed run's) are kept
        rows, _ = read_json_lines(os.path.join(run_dir, "metrics.jsonl"))
    except OSError:
        rows = []
    return dict(dir=run_dir, run=run, summary=summary, rows=[r for r in rows if isinstance(r, dict)])


def find_run_dirs(path: str) -> list[str]:
    """The run directories `path` names: itself when it holds run.json, else its subfolders that do (a
    `rlfleet up --seeds` folder: seed-0, seed-1, ...), in seed order.

    Raises:
        ValueError: neither (the message names the path).
    """
    if os.path.exists(os.path.join(path, "run.json")):
        return [path]
    try:
        names = os.listdir(path)
    except OSError as e:
        raise ValueError(
            f"{path}: {e.strerror}; give run directories or a folder of them (rlfleet up --seeds)."
        ) from None
    found = [os.path.join(path, n) for n in names if os.path.exists(os.path.join(path, n, "run.json"))]
    if not found:
        raise ValueError(f"{path}: no run directory in it (none holds run.json).")
    key = lambda p: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", os.path.basename(p))]  # noqa: E731
    return sorted(found, key=key)


def group_runs(runs: list[dict]) -> list[list[dict]]:
    """Runs grouped by what they ran (algorithm, env, preset, every setting and the env-step budget): the seeds of
    one experiment; groups in the order their first run was given."""
    groups: dict = {}
    for r in runs:
        what = ("algo", "env_id", "preset", "config", "teacher", "total_steps")
        key = json.dumps([r["run"].get(k) for k in what], sort_keys=True)
        groups.setdefault(key, []).append(r)
    return list(groups.values())


def _iqm_per_column(matrix: np.ndarray, reps: int = 2000) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """IQM of each column of a [runs, points] matrix and its stratified-bootstrap 95% CI (rliable)."""
    from scipy import stats

    return _estimates(matrix, lambda s: stats.trim_mean(s, 0.25, axis=0), reps)


def seeds_report(paths: list[str], points: int = 50) -> list[dict]:
    """The report of `rlfleet report PATH...`: the run directories the paths name (`find_run_dirs`), grouped by
    what they ran (`group_runs`). For each group: the runs (dir, seed, env steps, final and best evaluation
    return, finished or not); over the finished ones the finals' median, mean, IQM and its 95% CI; and the
    learning curve, the IQM over runs of the latest evaluation return at `points` env-step marks up to the
    shortest finished run's env steps, with its 95% CI. IQMs and CIs need rliable (the `report` extra): without
    it they are None.

    Raises:
        ValueError: a path names no run directory.
    """
    runs = [load_run(d) for p in paths for d in find_run_dirs(p)]
    return [_group_report(group, points) for group in group_runs(runs)]


def _run_row(r: dict) -> dict:
    """A run's row of the seeds' report (`seeds_report`) from what `load_run` read of it."""
    s = r["summary"] or {}
    finished = bool(s.get("completed")) and s.get("final_eval_return_mean") is not None
    latest = eval_points(r["rows"])
    return dict(
        dir=r["dir"],
        seed=r["run"].get("seed"),
        env_steps=s.get("env_steps") if s else (r["rows"][-1]["env_steps"] if r["rows"] else 0),
        finished=finished,
        final=s.get("final_eval_return_mean") if finished else None,
        best=s.get("best_eval_return_mean"),
        latest_eval=latest[-1][1] if latest else None,
    )


def _group_report(group: list[dict], points: int) -> dict:
    """One group's part of `seeds_report`."""
    group.sort(key=lambda r: (r["run"].get("seed") is None, r["run"].get("seed") or 0))
    first = group[0]["run"]
    rows = [_run_row(r) for r in group]
    finals = np.array([r["final"] for r in rows if r["finished"]], float)
    report = dict(
        algo=first.get("algo"),
        env_id=first.get("env_id"),
        preset=first.get("preset"),
        runs=rows,
        finished=int(finals.size),
        median=float(np.median(finals)) if finals.size else None,
        mean=float(finals.mean()) if finals.size else None,
        std=float(finals.std()) if finals.size else None,
        iqm=None,
        iqm_ci95=None,
        curve=None,
    )
    try:
        import rliable  # noqa: F401
    except ImportError:
        return report
    if finals.size >= 2:
        point, low, high = iqm_with_ci(finals[:, None])
        report.update(iqm=point, iqm_ci95=[low, high])
    done = [r for r, row in zip(group, rows) if row["finished"]]
    if len(done) >= 2:
        report["curve"] = _curve(done, min(row["env_steps"] for row in rows if row["finished"]), points)
    return report


def _curve(done: list[dict], budget: int, points: int) -> dict | None:
    """The IQM over the finished runs `done` of their latest evaluation return at `points` env-step marks up to
    `budget`, with its 95% CI; None where no mark has a value in every run."""
    marks = np.linspace(budget / points, budget, points).astype(int)
    values = [[return_at(r["rows"], int(m)) for m in marks] for r in done]
    keep = [j for j in range(points) if all(v[j] is not None for v in values)]
    if not keep:
        return None
    matrix = np.array([[v[j] for j in keep] for v in values], float)
    iqm, low, high = _iqm_per_column(matrix)
    return dict(env_steps=[int(marks[j]) for j in keep], iqm=iqm.tolist(), low=low.tolist(), high=high.tolist())


def format_seeds_report(report: list[dict]) -> str:
    """`seeds_report`'s result as text for people: a table of runs per group, then the statistics of its finals."""
    lines = []
    for g in report:
        lines.append(
            f"{g['algo']} on {g['env_id']} (preset {g['preset']}): {len(g['runs'])} run(s), {g['finished']} finished"
        )
        lines.append(f"  {'seed':>6}  {'env steps':>11}  {'final':>10}  {'best':>10}  run")
        for r in g["runs"]:
            final = f"{r['final']:,.1f}" if r["final"] is not None else "unfinished"
            best = f"{r['best']:,.1f}" if r["best"] is not None else "-"
            seed = "-" if r["seed"] is None else r["seed"]
            lines.append(f"  {seed:>6}  {r['env_steps'] or 0:>11,}  {final:>10}  {best:>10}  {r['dir']}")
        if g["finished"]:
            text = f"  final return: median {g['median']:,.1f}, mean {g['mean']:,.1f} (std {g['std']:,.1f})"
            if g["iqm"] is not None:
                text += f", IQM {g['iqm']:,.1f} [95% CI {g['iqm_ci95'][0]:,.1f}, {g['iqm_ci95'][1]:,.1f}]"
            elif g["finished"] >= 2:
                text += '; IQM and CIs need rliable: pip install -e ".[cpu,report]"'
            lines.append(text)
    return "\n".join(lines)


def plot_seeds_report(report: list[dict], path: str) -> None:
    """Learning curves with 95% CI bands (`seeds_report`'s curves: the IQM over runs of the evaluation return
    against env steps), one line per group, written as a PNG to `path` (matplotlib, the `report` extra).

    Raises:
        ValueError: no group has a curve (fewer than two finished runs in every group).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = [g for g in report if g["curve"]]
    if not curves:
        raise ValueError("no learning curve to draw: a curve needs two finished runs of one experiment.")
    fig, ax = plt.subplots(figsize=(7, 4))
    for g in curves:
        c = g["curve"]
        label = f"{g['algo']} {g['env_id']} ({g['preset']}, {g['finished']} runs)"
        (line,) = ax.plot(c["env_steps"], c["iqm"], label=label)
        ax.fill_between(c["env_steps"], c["low"], c["high"], color=line.get_color(), alpha=0.2)
    ax.set_xlabel("env steps")
    ax.set_ylabel("evaluation return (IQM over runs, 95% CI)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
