"""One `rlfleet up` command under two versions of rlfleet, side by side: is learning unchanged, and what does a run
take, on the same machine in the same hour?

A version is NAME=PYTHON: an interpreter with rlfleet installed from that version's checkout, e.g.

    git worktree add ../rlfleet-old COMMIT
    python3.11 -m venv ../old-venv && ../old-venv/bin/pip install -e "../rlfleet-old[cpu]"

`run` trains, seed by seed, one run of each version in a shuffled order (so that the machine's load falls on both
alike): `PYTHON -m rlfleet.deploy.cli up ARGS --seed S --logdir OUT/NAME-sS`, its process timed to its exit.
Finished runs are kept (a stopped one is trained again from the start), so the same command goes on after a stop.
`report` gives per version each seed's final evaluation return, their median and IQM with stratified-bootstrap
95% CIs (rliable), and the median wall-clock and env steps/s of the process (start-up included) and of the run
(summary.json's `wall_seconds`: from the learner's start of training to its end).

Usage:
    python benchmarks/code_ab.py run --version old=../old-venv/bin/python --version new=.venv/bin/python \
        --seeds 0 1 2 --out runs/main-job-ab -- --algo ppo --env HalfCheetah-v5 --total-steps 1000000
    python benchmarks/code_ab.py report runs/main-job-ab --json benchmarks/results/main-job-ab.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shlex
import shutil
import statistics
import subprocess
import time

from suite import interval_estimates  # benchmarks/ (this script's folder is on sys.path)

from rlfleet.common.files import atomic_write

PROCESS_FILE = "process.json"  # beside each run's summary.json: the command and its process's wall-clock


def _version(text: str) -> tuple[str, str]:
    """argparse type of --version: NAME=PYTHON."""
    name, sep, python = text.partition("=")
    if not sep or not name or not python or "/" in name:
        raise argparse.ArgumentTypeError(f"{text!r}: give NAME=PYTHON, e.g. old=../old-venv/bin/python")
    found = shutil.which(python) if os.sep not in python else os.path.abspath(python)  # runs start in their folder
    if not found or not os.access(found, os.X_OK):
        raise argparse.ArgumentTypeError(f"{python!r} is not an interpreter here: give the path of a venv's python")
    return name, found


def _read_json(path: str):
    """The JSON in `path`, or None where it is missing or unreadable (a run stopped before it wrote it)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def run(versions: list[tuple[str, str]], seeds: list[int], out: str, args: list[str]) -> None:
    """Trains every (version, seed) without a finished run in `out`, seed by seed, versions in a shuffled order.

    Raises:
        SystemExit: a run failed (its output, above the message, says why); the finished runs are kept.
    """
    order = random.Random(" ".join(args))
    for seed in seeds:
        for name, python in order.sample(versions, len(versions)):
            logdir = os.path.abspath(os.path.join(out, f"{name}-s{seed}"))
            summary = _read_json(os.path.join(logdir, "summary.json"))
            if (
                isinstance(summary, dict)
                and summary.get("completed")
                and os.path.exists(os.path.join(logdir, PROCESS_FILE))
            ):
                print(f"# {logdir}: finished earlier, kept", flush=True)
                continue
            if os.path.exists(logdir):  # stopped part-way: its timing would not be one process's, so start again
                shutil.rmtree(logdir)
            cmd = [python, "-m", "rlfleet.deploy.cli", "up", *args, "--seed", str(seed), "--logdir", logdir]
            print("$", shlex.join(cmd), flush=True)
            started_at = time.time()  # when, for the order of the runs; the duration is timed on the monotonic clock
            start = time.monotonic()
            code = subprocess.run(cmd, cwd=os.path.dirname(logdir)).returncode
            wall = time.monotonic() - start
            if code:
                raise SystemExit(
                    f"{logdir}: the run failed (exit status {code}; its output above says why). The runs finished "
                    "before it are kept: fix the cause and give the same command again to go on."
                )
            atomic_write(
                os.path.join(logdir, PROCESS_FILE),
                json.dumps(
                    dict(version=name, python=python, command=cmd, started_at=started_at, process_wall_seconds=wall),
                    indent=1,
                ),
            )


def report(out: str) -> dict:
    """Per version: each seed's final evaluation return, their median and IQM with CIs, and the median process
    wall-clock and env steps/s. Raises SystemExit when `out` holds no finished run."""
    runs = {}
    for entry in sorted(os.listdir(out)):
        logdir = os.path.join(out, entry)
        summary, process = (
            _read_json(os.path.join(logdir, "summary.json")),
            _read_json(os.path.join(logdir, PROCESS_FILE)),
        )
        if not (isinstance(summary, dict) and summary.get("completed") and isinstance(process, dict)):
            continue
        seed = int(entry.rpartition("-s")[2])
        runs.setdefault(process["version"], []).append(
            dict(
                seed=seed,
                final_eval_return_mean=summary["final_eval_return_mean"],
                env_steps=summary["env_steps"],
                process_wall_seconds=process["process_wall_seconds"],
                run_wall_seconds=summary["wall_seconds"],
                env_steps_per_second=summary["env_steps"] / process["process_wall_seconds"],
                run_env_steps_per_second=summary["env_steps"] / summary["wall_seconds"],
                command=process["command"],
                started_at=process.get("started_at"),  # None in records written before it was kept
            )
        )
    if not runs:
        raise SystemExit(f"{out}: no finished run (give `run` first)")
    result = dict(machine=f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores", versions={})
    for name, rows in sorted(runs.items()):
        rows.sort(key=lambda r: r["seed"])
        result["versions"][name] = dict(
            runs=rows,
            returns=interval_estimates([r["final_eval_return_mean"] for r in rows]),
            median_process_wall_seconds=statistics.median(r["process_wall_seconds"] for r in rows),
            median_env_steps_per_second=statistics.median(r["env_steps_per_second"] for r in rows),
            median_run_wall_seconds=statistics.median(r["run_wall_seconds"] for r in rows),
            median_run_env_steps_per_second=statistics.median(r["run_env_steps_per_second"] for r in rows),
        )
    return result


def print_report(result: dict) -> None:
    for name, v in result["versions"].items():
        r = v["returns"]
        seeds = ", ".join(f"s{x['seed']} {x['final_eval_return_mean']:.0f}" for x in v["runs"])
        print(
            f"{name}: final return {seeds}; IQM {r['iqm']:.0f} [{r['iqm_ci95'][0]:.0f}, {r['iqm_ci95'][1]:.0f}], "
            f"median {r['median']:.0f}; process {v['median_process_wall_seconds']:.0f} s, "
            f"{v['median_env_steps_per_second']:,.0f} env steps/s; run {v['median_run_wall_seconds']:.0f} s, "
            f"{v['median_run_env_steps_per_second']:,.0f} env steps/s (medians)"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="train the missing runs, then report")
    r.add_argument("--version", dest="versions", type=_version, action="append", required=True)
    r.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    r.add_argument("--out", required=True, help="a folder of run directories, NAME-sSEED")
    r.add_argument("up_args", nargs=argparse.REMAINDER, help="-- then `rlfleet up`'s arguments (no --seed, --logdir)")
    q = sub.add_parser("report", help="report the finished runs in a folder")
    q.add_argument("out")
    q.add_argument("--json", default=None, help="also write the report here")
    args = p.parse_args()
    if args.command == "report" and not os.path.isdir(args.out):
        p.error(f"{args.out} is not a folder: give the --out folder of a `code_ab.py run`")
    if args.command == "run":
        up_args = args.up_args[1:] if args.up_args[:1] == ["--"] else args.up_args
        if any(a.split("=")[0] in ("--seed", "--logdir", "--resume") for a in up_args):
            p.error("--seed, --logdir and --resume are the script's own: give --seeds and --out instead")
        if len({n for n, _ in args.versions}) != len(args.versions):
            p.error("each --version needs a name of its own")
        os.makedirs(args.out, exist_ok=True)
        run(args.versions, args.seeds, args.out, up_args)
        result = report(args.out)
    else:
        result = report(args.out)
        if args.json:
            atomic_write(args.json, json.dumps(result, indent=1))
    print_report(result)


if __name__ == "__main__":
    main()
