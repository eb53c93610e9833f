"""`rlfleet up --seeds 0,1,2 --logdir DIR`: one run per seed, each an `rlfleet up` of its own in DIR/seed-S, one
after another or `--parallel K` at a time; the same command again continues where they stopped. At the end, the
seeds' report (`rlfleet.analysis.runs_report`)."""

from __future__ import annotations

import functools
import json
import os
import shlex
import signal
import subprocess
import sys
import time

from rlfleet.common.files import atomic_write
from rlfleet.common.logs import logger
from rlfleet.common.parent import PARENT_PID_ENV
from rlfleet.learner.run_dir import run_state

log = logger("up")

# Why a report has no curve: each run's metrics.jsonl must hold evaluations before the shortest run's end.
NO_CURVE = (
    "the runs' metrics hold too few evaluations before the shortest run's end (a metrics row, with the latest "
    "evaluation, is written every --report-interval seconds)"
)
SEEDS_FILE = "seeds.json"  # DIR/seeds.json: the seeds, the settings file and the command


def parse_seeds(items: tuple[str, ...], limit: int) -> list[int]:
    """`--seeds` values as given: comma-separated seeds and ranges ("0,1,2", "0-4", "0-2,7"; the option may also
    be repeated), each in [0, `limit`]; duplicates are dropped, order kept.

    Raises:
        ValueError: something else (the message shows what is taken).
    """
    seeds: list[int] = []
    for item in items:
        for part in str(item).replace(" ", ",").split(","):
            if not part:
                continue
            low, _, high = part.partition("-")
            if not low.isdigit() or (high and not high.isdigit()):
                raise ValueError(f"--seeds {item!r}: give seeds as 0,1,2 or a range 0-4 (or both: 0-2,7).")
            first, last = int(low), int(high or low)
            if first > last or last > limit:
                raise ValueError(f"--seeds {item!r}: a range goes up (0-4), and seeds go from 0 to {limit}.")
            seeds += [s for s in range(first, last + 1) if s not in seeds]
    if not seeds:
        raise ValueError("--seeds: no seed given; e.g. --seeds 0,1,2.")
    return seeds


def seed_dir(logdir: str, seed: int) -> str:
    """The run directory of `seed` in a `--seeds` folder: DIR/seed-S."""
    return os.path.join(logdir, f"seed-{seed}")


class _Run:
    """One seed's `rlfleet up`, in a session of its own (a Ctrl-C reaches this process, which passes it on)."""

    def __init__(self, seed: int, args: list[str], log_path: str | None):
        self.seed, self.stopping = seed, False
        self.log = open(log_path, "ab") if log_path else None
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rlfleet.deploy.cli", "up", *args],
            stdout=self.log,
            stderr=subprocess.STDOUT if self.log else None,
            start_new_session=True,
            env=dict(os.environ, **{PARENT_PID_ENV: str(os.getpid())}),  # it stops when this process dies
        )

    def stop(self) -> None:
        """Asks the run to stop as Ctrl-C does, once: `up` stops its cluster with a checkpoint (a second signal
        would cut that short)."""
        if self.stopping or self.proc.poll() is not None:
            return
        self.stopping = True
        try:
            os.kill(self.proc.pid, signal.SIGINT)
        except ProcessLookupError:
            pass

    def close(self) -> None:
        if self.log:
            self.log.close()


def run_seeds(
    seeds: list[int], logdir: str, settings_path: str, total_steps: int, parallel: int, up_args: list[str]
) -> int:
    """Runs `rlfleet up --run-config SETTINGS --seed S --logdir DIR/seed-S UP_ARGS` for each seed not finished
    yet (`--resume DIR/seed-S` where it has a checkpoint), `parallel` at a time; with one at a time its output
    is this process's, else each writes DIR/seed-S/logs/up.log. SIGINT/SIGTERM are passed to the runs under way
    (each, once, as Ctrl-C: it checkpoints and stops), as is SIGHUP, and no new one starts; every run stops when
    this process dies. Prints the seeds' report at the end.

    Returns:
        0 when every seed finished its budget, 130 when stopped, else the first failed run's exit status.
    """
    command = shlex.join(["rlfleet", *sys.argv[1:]])
    atomic_write(
        os.path.join(logdir, SEEDS_FILE),
        json.dumps(dict(seeds=seeds, settings=os.path.abspath(settings_path), command=command), indent=2),
    )
    pending = _pending(seeds, logdir, total_steps)
    start = functools.partial(_start, logdir=logdir, settings_path=settings_path, total_steps=total_steps)
    stopping: list[int] = []
    stop_signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, lambda signum, frame: stopping.append(signum)) for sig in stop_signals}
    running: list[_Run] = []
    failed = 0
    try:
        while pending or running:
            code = _reap(running)  # every pass: runs that ended leave `running`, failed or not
            failed = failed or code
            if stopping:
                for run in running:
                    run.stop()
                pending = []
            while pending and len(running) < parallel and not stopping:
                running.append(start(*pending.pop(0), up_args=up_args, own_log=parallel > 1))
            time.sleep(0.2)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for run in running:  # only after an error here: stop what still runs, and wait for it
            run.stop()
            run.proc.wait()
            run.close()
    if stopping:
        print(f"rlfleet up: stopped; continue these seeds (finished ones are kept) with:\n  {command}", flush=True)
        return 130
    if failed:
        print(
            f"rlfleet up: a seed failed; the others are kept. After fixing it, continue with:\n  {command}", flush=True
        )
        return failed
    _report(logdir)
    return 0


def _pending(seeds: list[int], logdir: str, total_steps: int) -> list[tuple[int, str]]:
    """(seed, "new" or "resume") of each seed whose run has not finished `total_steps`; says which finished."""
    pending = []
    for seed in seeds:
        state = run_state(seed_dir(logdir, seed), total_steps)
        if state == "done":
            print(f"rlfleet up: seed {seed}: finished earlier ({seed_dir(logdir, seed)})", flush=True)
        else:
            pending.append((seed, state))
    return pending


def _reap(running: list[_Run]) -> int:
    """Takes the runs that ended out of `running`, saying how each ended; returns the exit status of the first
    that failed (1 for one killed by a signal), else 0."""
    failed = 0
    for run in [r for r in running if r.proc.poll() is not None]:
        running.remove(run)
        run.close()
        code = run.proc.returncode
        print(
            f"rlfleet up: seed {run.seed}: {'finished' if code == 0 else f'ended with exit status {code}'}",
            flush=True,
        )
        if code not in (0, 130) and not failed:
            failed = code if code > 0 else 1  # < 0: killed by a signal
    return failed


def _start(
    seed: int, state: str, *, logdir: str, settings_path: str, total_steps: int, up_args: list[str], own_log: bool
) -> _Run:
    """Starts the run of `seed` (`state` "resume": from its checkpoint), its output in its own up.log when
    `own_log` (several runs at a time), else this process's."""
    run_dir = seed_dir(logdir, seed)
    where = ["--resume", run_dir] if state == "resume" else ["--logdir", run_dir]
    args = ["--run-config", settings_path, "--seed", str(seed), "--total-steps", str(total_steps), *where, *up_args]
    log_path = None
    if own_log:
        os.makedirs(os.path.join(run_dir, "logs"), exist_ok=True)
        log_path = os.path.join(run_dir, "logs", "up.log")
    print(
        f"rlfleet up: seed {seed}: {'resumed' if state == 'resume' else 'started'} in {run_dir}"
        + (f" (its output: {log_path})" if log_path else ""),
        flush=True,
    )
    return _Run(seed, args, log_path)


def _report(logdir: str) -> None:
    """Prints the seeds' report and writes DIR/learning-curves.png where the report extra is installed."""
    from rlfleet.analysis.runs_report import format_seeds_report, plot_seeds_report, seeds_report

    report = seeds_report([logdir])
    print(format_seeds_report(report), flush=True)
    if not any(g["curve"] for g in report):
        if any(g["finished"] >= 2 for g in report):
            print(f"rlfleet up: no learning curves: {NO_CURVE}", flush=True)
    else:
        path = os.path.join(logdir, "learning-curves.png")
        try:
            plot_seeds_report(report, path)
            print(f"rlfleet up: learning curves: {path}", flush=True)
        except ImportError:
            pass
        except OSError as e:
            log.warning("no learning curves: %s: %s", path, e.strerror or e)
