"""Reincarnation: env steps a QDagger student (and each of the paper's alternatives, --methods) needs to reach its
teacher's return, against DQN from scratch (tabula rasa) and against each other.

1. Teacher: `rlfleet up --algo dqn` with --teacher-seed (0) for --teacher-steps env steps.
2. DQN from scratch: the teacher run itself plus K-1 more seeds, the first from 0 that are not the teacher's
   (K = --scratch-seeds, default --seeds), each for --scratch-steps env steps (default --teacher-steps; at
   least --student-steps, the budget they are compared at).
3. Students of each method of --methods (qdagger, kickstarting, pretrain_finetune, rehearsal, dqfd, jsrl; default
   qdagger): seeds 0..K-1 from the same teacher, each for --student-steps online env steps (after the preset's
   offline pretraining, or --offline-steps), with the same --student-set settings.
Every run is reused when its directory holds a run that completed its budget, or (--records) when its record
does; a stopped one, or one of a smaller budget, continues with --resume, so the long Atari runs can be done
over several sessions. With --records each finished run leaves a record (summary and evaluations, a few KB)
that stands in for its directory later, so DQN-from-scratch runs need not be kept; a student that still has to
run needs its teacher's directory (checkpoint and replay).
For each run: the env steps of the first progress row whose latest evaluation return reaches the
target (--fraction of the way from a random policy's evaluation return to the teacher's, both as the
students measured them at their start), the final evaluation return, and the return at the students'
budget. A run that never reached the target counts as its budget, a lower bound, and the output says
which way that bends the ratio of median env steps (student / scratch). Then IQMs with
stratified-bootstrap 95% CIs (rliable, when installed) of human-normalized returns (raw returns for
envs without reference scores): at the students' budget for every run (the same online budget), and
final; the probability of improvement (rliable) of each method over tabula rasa and over each other method, on
the returns at the students' budget; and a learning-curve plot (benchmarks/report.py) with the target drawn.

Usage:
    python benchmarks/reincarnation.py --env CartPole-v1 --seeds 3 --teacher-steps 30000 \
        --student-steps 15000 --workdir runs/reincarnation-cartpole
    python benchmarks/reincarnation.py --env CartPole-v1 --seeds 5 --methods qdagger,kickstarting,dqfd,rehearsal,\
pretrain_finetune --teacher-steps 30000 --student-steps 15000 --records benchmarks/results/reincarnation-records
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np
import report as report_lib  # benchmarks/report.py (this script's folder is on sys.path)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _has_offline(method: str) -> bool:
    """Whether the method pretrains on the teacher's replay (kickstarting and JSRL do not: --offline-steps is not
    theirs)."""
    return method not in ("kickstarting", "jsrl")


def _completed(summary: dict, budget: int) -> bool:
    """Whether a run's summary says it completed a budget of at least `budget` env steps."""
    return bool(summary.get("completed")) and summary["env_steps"] >= budget


def read_record(records: str | None, logdir: str) -> dict | None:
    """The record of the run in `logdir` in the folder `records` (`report.save_record`), with its "path";
    None without one."""
    path = report_lib.record_path(records, logdir) if records else None
    if path and os.path.exists(path):
        with open(path) as f:
            return dict(json.load(f), path=path)
    return None


def finished_source(logdir: str, budget: int, records: str | None) -> str | None:
    """Where a run that completed `budget` env steps is: its directory, else its record in the folder
    `records` (RECORDS/NAME.json, `report.save_record`), else None (it has to run)."""
    summary_path = os.path.join(logdir, "summary.json")
    if os.path.exists(summary_path):
        with open(summary_path) as f:
            if _completed(json.load(f), budget):
                return logdir
    record = read_record(records, logdir)
    return record["path"] if record and _completed(record["summary"], budget) else None


def _up(args: list[str], logdir: str) -> bool:
    """Runs `rlfleet up ARGS --logdir LOGDIR` (ARGS hold --total-steps): continues a run there that was
    stopped or had a smaller budget (`--resume`: long runs go on over several sessions), else starts it.
    Returns whether it continued one.

    Raises:
        RuntimeError: the run failed (its output's end attached).
    """
    resume = ["--resume", logdir] if os.path.exists(os.path.join(logdir, "checkpoints", "checkpoint")) else []
    cmd = [sys.executable, "-m", "rlfleet.deploy.cli", "up", *args, "--logdir", logdir, *resume]
    cmd += ["--report-interval", "2"]
    print("$ rlfleet up " + " ".join(args + ["--logdir", logdir, *resume]), flush=True)
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"run failed ({logdir}):\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    print(out.stdout.strip().splitlines()[-1], flush=True)
    return bool(resume)


def steps_to_reach(rows: list[dict], target: float) -> int | None:
    """Env steps of the first metrics row whose latest evaluation return is >= target (None: never)."""
    return next(
        (r["env_steps"] for r in rows if r.get("eval_return_mean") is not None and r["eval_return_mean"] >= target),
        None,
    )


def at_budget(run: dict, budget: int) -> dict:
    """A run as it stood at `budget` env steps when it ran for more (a longer run reused, e.g. an earlier
    teacher as a DQN-from-scratch seed): its rows up to there, and its latest evaluation by then as its final
    return (summary `truncated_from`: the env steps it ran). A run of at most that budget is returned as is."""
    s = run["summary"]
    ran = s.get("total_steps") or s["env_steps"]
    if ran <= budget:
        return run
    rows = [r for r in run["rows"] if r["env_steps"] <= budget]
    final = report_lib.return_at(rows, budget)
    summary = dict(s, env_steps=budget, total_steps=budget, final_eval_return_mean=final, truncated_from=ran)
    return dict(run, rows=rows, summary=summary)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--teacher-steps", type=int, default=30000, help="the teacher's env steps (DQN, --teacher-seed)")
    p.add_argument("--student-steps", type=int, default=15000, help="each student's online env steps")
    p.add_argument(
        "--scratch-steps",
        type=int,
        default=None,
        help="env steps of the other DQN-from-scratch seeds (default --teacher-steps; at least --student-steps); "
        "all DQN runs are compared at the smaller of this and --teacher-steps",
    )
    p.add_argument("--offline-steps", type=int, default=None, help="students' offline gradient steps (preset's)")
    p.add_argument(
        "--fraction",
        type=float,
        default=1.0,
        help="target = random return + fraction x (teacher return - random return), as the students measured them",
    )
    p.add_argument(
        "--scratch-seeds", type=int, default=None, help="DQN-from-scratch runs, the teacher included (default: --seeds)"
    )
    p.add_argument("--set", dest="sets", action="append", default=[], help="KEY=VALUE for every run")
    p.add_argument(
        "--student-set",
        dest="student_sets",
        action="append",
        default=[],
        help="KEY=VALUE for the students of every method only (after --set)",
    )
    p.add_argument(
        "--methods",
        default="qdagger",
        help="comma-separated student algorithms, each from the same teacher (qdagger, kickstarting, "
        "pretrain_finetune, rehearsal, dqfd, jsrl)",
    )
    p.add_argument("--workdir", default="runs/reincarnation")
    p.add_argument(
        "--teacher-seed", type=int, default=0, help="the teacher's seed (DQN from scratch takes the others from 0)"
    )
    p.add_argument(
        "--records",
        default=None,
        help="folder of run records (RUN.json: summary and evaluations, a few KB): each finished run writes one, "
        "and a run whose directory is gone is read from its record (Atari run directories are GBs)",
    )
    args = p.parse_args()
    scratch_steps = args.teacher_steps if args.scratch_steps is None else args.scratch_steps
    shortest = min([args.teacher_steps] + ([scratch_steps] if (args.scratch_seeds or args.seeds) > 1 else []))
    if shortest < args.student_steps:
        p.error(
            f"the DQN-from-scratch runs ({shortest:,} env steps) must reach the students' budget "
            f"({args.student_steps:,}) to be compared at it: raise --scratch-steps/--teacher-steps"
        )
    sets = [a for kv in args.sets for a in ("--set", kv)]
    name = args.env.replace("/", "-")
    teacher = os.path.join(args.workdir, f"{name}-dqn-s{args.teacher_seed}")
    scratch_seeds = args.scratch_seeds or args.seeds
    others = [s for s in range(scratch_seeds + 1) if s != args.teacher_seed][: scratch_seeds - 1]
    scratch = [teacher] + [os.path.join(args.workdir, f"{name}-dqn-s{s}") for s in others]
    # Students are named for their teacher unless it is seed 0 (the names of runs made before --teacher-seed).
    of = "" if args.teacher_seed == 0 else f"-t{args.teacher_seed}"
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    by_method = {m: [os.path.join(args.workdir, f"{name}-{m}{of}-s{s}") for s in range(args.seeds)] for m in methods}
    students = [d for m in methods for d in by_method[m]]
    offline = ["--offline-steps", str(args.offline_steps)] if args.offline_steps is not None else []
    student_sets = [a for kv in args.student_sets for a in ("--set", kv)]
    plan = [(teacher, args.teacher_seed, args.teacher_steps, ["--algo", "dqn"])]
    plan += [(d, s, scratch_steps, ["--algo", "dqn"]) for d, s in zip(scratch[1:], others)]
    plan += [
        (d, s, args.student_steps, ["--algo", m, "--teacher", teacher, *(offline if _has_offline(m) else [])])
        for m in methods
        for s, d in enumerate(by_method[m])
    ]

    def has_checkpoint(d: str) -> bool:
        return os.path.exists(os.path.join(d, "checkpoints", "checkpoint"))

    os.makedirs(args.workdir, exist_ok=True)  # the report goes there, even when every run is read from records
    # Every run's arguments, checked against its record before anything runs.
    todo = []
    for d, seed, budget, algo in plan:
        extra = student_sets if d in students else []
        run_args = [*algo, "--env", args.env, "--total-steps", str(budget), "--seed", str(seed), *sets, *extra]
        at = run_args.index("--total-steps")
        settings = run_args[:at] + run_args[at + 2 :]  # what the run is, its budget aside
        source, record = finished_source(d, budget, args.records), read_record(args.records, d)
        if record and record.get("args") is not None and record["args"] != settings:
            raise SystemExit(
                f"reincarnation.py: {record['path']} is a run of {' '.join(record['args'])}, not of "
                f"{' '.join(settings)}: give another --records folder (or remove that record to run it again)."
            )
        if d == teacher:
            teacher_record = record
        elif source is None and d in students and not has_checkpoint(teacher) and teacher_record:
            raise SystemExit(
                f"reincarnation.py: the teacher's run directory {teacher} is gone (its record "
                f"{teacher_record['path']} is left), and student {d} still has to run: a student needs its "
                "teacher's checkpoint and replay. Train a new teacher: give another --teacher-seed (or another "
                "--workdir); the finished DQN-from-scratch runs are reused from --records."
            )
        if source is None and record and not has_checkpoint(d):
            raise SystemExit(
                f"reincarnation.py: {d} has to run to {budget:,} env steps, but only its record is left "
                f"({record['path']}, {record['summary']['env_steps']:,} env steps): a run continues only from "
                "its directory. Compare at at most the recorded budget, or remove the record to run it again "
                "from the start."
            )
        todo.append((d, run_args, settings, source))
    sources = {}
    for d, run_args, settings, source in todo:
        fields = {}
        if source is None:
            resumed = _up(run_args, d)
            source = d
            fields = dict(command="rlfleet up " + " ".join(run_args + ["--logdir", d]), args=settings)
            if resumed:
                fields["continued_with_resume"] = True
        else:
            print(f"reusing {source}", flush=True)
        if args.records and source == d:  # a record of every finished run (a record's other fields are kept)
            report_lib.save_record(report_lib.load_runs([d])[0], report_lib.record_path(args.records, d), **fields)
        sources[d] = source

    # Every DQN run is compared at one budget (a teacher trained longer than the scratch seeds counts to theirs).
    dqn_budget = min(args.teacher_steps, scratch_steps) if len(scratch) > 1 else args.teacher_steps
    budgets = {d: dqn_budget for d in scratch}
    budgets.update({d: args.student_steps for d in students})
    runs = report_lib.load_runs([sources[d] for d in scratch + students])
    for r, d in zip(runs, scratch + students):
        r["dir"] = d  # a run read from its record is still known by its directory
    runs = [at_budget(r, budgets[r["dir"]]) for r in runs]
    by_dir = {r["dir"]: r for r in runs}
    teacher_return = float(np.mean([by_dir[d]["summary"]["teacher_eval_return_mean"] for d in students]))
    random_return = float(np.mean([by_dir[d]["summary"]["random_eval_return_mean"] for d in students]))
    # The fraction of the way from a random policy's return to the teacher's (a plain multiple of a negative
    # return, Pong's, would make a fraction below 1 a harder target, not an easier one).
    target = random_return + args.fraction * (teacher_return - random_return)

    def score_at_student_budget(d: str) -> float | None:
        try:
            return report_lib.run_score(by_dir[d], args.student_steps, budgets[d])
        except ValueError:  # no evaluation by then
            return None

    table = []
    for d in scratch + students:
        r = by_dir[d]
        table.append(
            dict(
                run=os.path.basename(d),
                algo=r["summary"]["algo"],
                env_steps_to_target=steps_to_reach(r["rows"], target),
                return_at_student_budget=score_at_student_budget(d),
                final_eval_return=r["summary"]["final_eval_return_mean"],
                env_steps=r["summary"]["env_steps"],
                budget=budgets[d],
            )
        )
    print(f"\nteacher {teacher}: evaluation return {teacher_return:.1f}; target {target:.1f}")
    print(f"{'run':<28} {'env steps to target':>20} {'return @ ' + str(args.student_steps):>16} {'final':>8}")
    for t in table:
        reach = "never" if t["env_steps_to_target"] is None else f"{t['env_steps_to_target']:,}"
        at = "-" if t["return_at_student_budget"] is None else f"{t['return_at_student_budget']:.1f}"
        final = "-" if t["final_eval_return"] is None else f"{t['final_eval_return']:.1f}"
        print(f"{t['run']:<28} {reach:>20} {at:>16} {final:>8}")

    def median_steps(algo: str) -> tuple[float, bool]:
        # A run that never reached the target counts as its whole budget: a lower bound (flagged).
        steps = [t["env_steps_to_target"] for t in table if t["algo"] == algo]
        budgets = [t["budget"] for t in table if t["algo"] == algo]
        values = [s if s is not None else b for s, b in zip(steps, budgets)]
        return float(np.median(values)), any(s is None for s in steps)

    scratch_med, scratch_censored = median_steps("dqn")
    result = dict(env=args.env, teacher=teacher, teacher_return=teacher_return, random_return=random_return)
    result.update(target=target, runs=table, median_steps_dqn=scratch_med, scratch_censored=scratch_censored)
    for m in methods:
        student_med, student_censored = median_steps(m)
        ratio = student_med / scratch_med if scratch_med else float("nan")
        print(
            f"median env steps to target: {m} {student_med:,.0f}, DQN from scratch {scratch_med:,.0f} -> ratio "
            f"{ratio:.3f}{_bound(student_censored, scratch_censored)} (target <= 0.10)"
        )
        result[f"median_steps_{m}"], result[f"{m}_censored"] = student_med, student_censored
        result["ratio" if m == "qdagger" else f"ratio_{m}"] = ratio
    if "qdagger" in methods:  # the names of the records before --methods
        result["students_censored"] = result["qdagger_censored"]
    result["comparisons"] = _comparisons(table, methods)
    try:
        for key, when, at in (
            ("report_at_student_budget", f"at {args.student_steps:,} env steps", args.student_steps),
            ("report", "final", None),
        ):
            try:
                result[key] = report_lib.report(runs, at, budgets)
            except ValueError as e:  # a run without an evaluation by then: the other numbers still stand
                result[key] = dict(error=str(e))
                print(f"no IQM {when}: {e}")
                continue
            for algo, a in result[key]["iqm"].items():
                print(
                    f"{algo}: IQM ({a['scale']}) {when} {a['iqm']:.3f}, 95% CI [{a['ci95'][0]:.3f}, {a['ci95'][1]:.3f}]"
                )
        longest_other = max([scratch_steps if len(scratch) > 1 else 0, args.student_steps])
        zoom = longest_other if longest_other < args.teacher_steps else None
        report_lib.plot(runs, os.path.join(args.workdir, f"{name}-curves.png"), target=target, zoom_env_steps=zoom)
        print(f"plot: {os.path.join(args.workdir, name + '-curves.png')}")
        # One line per method (the median over its seeds, the band their interquartile range), to the DQN runs'
        # budget.
        methods_plot = os.path.join(args.workdir, f"{name}-methods.png")
        report_lib.plot_groups(runs, methods_plot, target=target, max_env_steps=dqn_budget)
        print(f"plot: {methods_plot}")
    except ImportError as e:
        print(f"(no IQM / plot: {e}; pip install -e '.[cpu,report]')")
    with open(os.path.join(args.workdir, f"{name}-reincarnation.json"), "w") as f:
        json.dump(result, f, indent=2)


def _bound(student_censored: bool, scratch_censored: bool) -> str:
    """What runs that never reached the target (counted as their budget) do to the ratio of median env steps."""
    if scratch_censored and not student_censored:
        return " (some DQN runs never reached the target: their budgets are lower bounds; the ratio is at most this)"
    if student_censored and not scratch_censored:
        return " (some students never reached the target: the ratio is at least this)"
    if student_censored and scratch_censored:
        return " (runs of both kinds never reached the target: the ratio is not bounded either way)"
    return ""


def _comparisons(table: list[dict], methods: list[str]) -> list[dict]:
    """Each method against tabula rasa (dqn) and against each other method: the probability that a run of it
    scores more at the students' budget, and the IQM difference, with 95% CIs (`compare_with_ci`); [] without
    rliable or with fewer than `MIN_COMPARED_RUNS` scored runs a side."""
    try:
        from rlfleet.analysis.runs_report import MIN_COMPARED_RUNS, compare_with_ci
    except ImportError:
        return []
    scores = {}
    for t in table:
        if t["return_at_student_budget"] is not None:
            scores.setdefault(t["algo"], []).append(t["return_at_student_budget"])
    out = []
    for i, x in enumerate(methods):
        for y in ["dqn", *methods[i + 1 :]]:
            if min(len(scores.get(x, [])), len(scores.get(y, []))) < MIN_COMPARED_RUNS:
                continue
            try:
                c = compare_with_ci(np.array(scores[x]), np.array(scores[y]))
            except ImportError:
                return []
            as_list = lambda v: [float(e) for e in np.ravel(v)]  # noqa: E731
            pair = dict(x=x, y=y, probability_of_improvement=as_list(c["probability_of_improvement"]))
            pair["iqm_difference"] = as_list(c["iqm_difference"])
            print(
                f"P({x} > {y}) at the students' budget: {pair['probability_of_improvement'][0]:.2f} "
                f"[{pair['probability_of_improvement'][1]:.2f}, {pair['probability_of_improvement'][2]:.2f}]"
            )
            out.append(pair)
    return out


if __name__ == "__main__":
    main()
