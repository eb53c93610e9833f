"""Several seeds with one command: `rlfleet up --seeds ... --logdir DIR` runs one `up` per seed in DIR/seed-S (one
after another, or --parallel K at a time), continues them when given again, and ends with `rlfleet report`'s
statistics; `rlfleet report` on its own."""

import json
import signal
import subprocess
import sys

import psutil
import pytest
from helpers import ENV, ROOT, rlfleet, stop_group, wait_for

from rlfleet.algorithms.settings import RunSettings

pytestmark = pytest.mark.slow

# A metrics row (with the latest evaluation) every half second: the learning curves need several in runs of a
# few seconds.
SMALL = (
    "--algo", "ppo", "--env", "InvertedPendulum-v5", "--set", "eval_every_updates=1", "--set", "eval_episodes=2",
    "--report-interval", "0.5",
)  # fmt: skip


def _summary(run_dir):
    return json.loads((run_dir / "summary.json").read_text())


def test_seeds_run_continue_and_report(tmp_path):
    logdir = tmp_path / "seeds [1]"
    args = ("--total-steps", 4096, "--seeds", "0,1", "--parallel", 2, "--logdir", logdir)
    out = rlfleet("up", *SMALL, *args, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for seed in (0, 1):
        run = logdir / f"seed-{seed}"
        assert json.loads((run / "run.json").read_text())["seed"] == seed
        assert _summary(run)["completed"] and _summary(run)["env_steps"] >= 4096
        assert (run / "logs" / "up.log").exists()  # with --parallel > 1 each run's output goes to its own log
    assert "IQM" in out.stdout and "95% CI" in out.stdout, out.stdout
    assert (logdir / "learning-curves.png").stat().st_size > 0
    assert json.loads((logdir / "seeds.json").read_text())["seeds"] == [0, 1]
    finished_at = {s: (logdir / f"seed-{s}" / "summary.json").stat().st_mtime for s in (0, 1)}

    # The same command again runs nothing: both seeds are finished.
    again = rlfleet("up", *SMALL, "--total-steps", 4096, "--seeds", "0,1", "--logdir", logdir, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert again.stdout.count("finished earlier") == 2
    assert {s: (logdir / f"seed-{s}" / "summary.json").stat().st_mtime for s in (0, 1)} == finished_at

    # A larger budget and one more seed: seeds 0 and 1 continue from their checkpoints, seed 2 starts. Actors
    # collect on while a run ends, so a run can end far past its budget: the new one is past both ends.
    budget = max(_summary(logdir / f"seed-{s}")["env_steps"] for s in (0, 1)) + 4096
    more = rlfleet("up", *SMALL, "--total-steps", budget, "--seeds", "0-2", "--logdir", logdir, timeout=900)
    assert more.returncode == 0, more.stdout[-3000:] + more.stderr[-3000:]
    assert "seed 0: resumed" in more.stdout and "seed 1: resumed" in more.stdout and "seed 2: started" in more.stdout
    for seed in (0, 1, 2):
        assert _summary(logdir / f"seed-{seed}")["env_steps"] >= budget

    # rlfleet report on the folder: every seed, and the statistics, as JSON too.
    report_json = tmp_path / "report.json"
    out = rlfleet("report", logdir, "--json", report_json, "--plot", tmp_path / "curves.png", timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (group,) = json.loads(report_json.read_text())["groups"]
    finals = [_summary(logdir / f"seed-{s}")["final_eval_return_mean"] for s in (0, 1, 2)]
    assert [r["seed"] for r in group["runs"]] == [0, 1, 2] and [r["final"] for r in group["runs"]] == finals
    assert group["median"] == pytest.approx(sorted(finals)[1])
    low, high = group["iqm_ci95"]
    assert min(finals) <= low <= group["iqm"] <= high <= max(finals)
    assert len(group["curve"]["env_steps"]) == len(group["curve"]["iqm"]) > 0
    assert (tmp_path / "curves.png").stat().st_size > 0


def test_ctrl_c_stops_the_seeds_and_the_same_command_continues(tmp_path):
    logdir = tmp_path / "seeds"
    args = ["up", *SMALL, "--total-steps", "200000", "--seeds", "0,1", "--logdir", str(logdir)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlfleet.deploy.cli", *args],
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    metrics = logdir / "seed-0" / "metrics.jsonl"
    try:
        wait_for(lambda: metrics.exists() and metrics.read_text().count("\n") >= 2, 180, "seed 0 to train")
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=120)
    finally:
        stop_group(proc)
    assert proc.returncode == 130, output[-3000:]
    # Seed 0's up got the stop once and stopped its cluster cleanly (its output is on this terminal).
    assert "checkpointing the learner" in output and "Traceback" not in output, output[-3000:]
    # Stopped once, as Ctrl-C stops one `up`: it ends 130 with its resume line, not cut short by a second signal.
    assert "Aborted!" not in output and "exit status -" not in output and "Resume with" in output, output[-3000:]
    assert "continue these seeds" in output and "--seeds 0,1" in output, output[-3000:]
    assert (logdir / "seed-0" / "checkpoints" / "checkpoint").exists()  # seed 0 checkpointed as it stopped
    assert not (logdir / "seed-1").exists()  # seed 1 never started
    # Nothing of seed 0's cluster outlives the command.
    left = [
        p.info["cmdline"] for p in psutil.process_iter(["cmdline"]) if str(logdir) in " ".join(p.info["cmdline"] or [])
    ]
    assert not left, left
    # The printed command, with a smaller budget, finishes both.
    out = rlfleet("up", *SMALL, "--total-steps", 4096, "--seeds", "0,1", "--logdir", logdir, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "seed 0: finished earlier" in out.stdout or "seed 0: resumed" in out.stdout
    assert all(_summary(logdir / f"seed-{s}")["completed"] for s in (0, 1))


@pytest.mark.parametrize(
    "extra, message",
    [
        (("--seeds", "0,1", "--seed", "3"), "--seed and --seeds"),
        (("--seeds", "zero"), "give seeds as 0,1,2"),
        (("--seeds", "4-2"), "a range goes up"),
        (("--parallel", "2"), "--parallel goes with --seeds"),
        (("--seeds", "0,1", "--parallel", "2", "--learner-port", "45555"), "would share the port"),
    ],
)
def test_seeds_bad_input(tmp_path, extra, message):
    out = rlfleet("up", *SMALL, "--total-steps", 4096, "--logdir", tmp_path / "r", *extra, timeout=120)
    assert out.returncode == 2 and message in out.stderr, out.stderr


def test_report_refuses_what_is_not_a_run(tmp_path):
    (tmp_path / "empty").mkdir()
    out = rlfleet("report", tmp_path / "empty", timeout=120)
    assert out.returncode == 2 and "no run directory in it" in out.stderr, out.stderr


def test_seeds_after_a_failed_one_still_run_and_the_command_ends_with_its_status(tmp_path):
    """A seed whose run fails (here at once: an option its `up` refuses) does not hold up the others: each still
    runs, and the command ends with the first failure's exit status instead of waiting for good."""
    logdir = tmp_path / "seeds"
    logdir.mkdir()
    settings = logdir / "settings.json"
    settings.write_text(json.dumps(RunSettings.resolve("dqn", "CartPole-v1").to_json()))
    code = subprocess.run(
        [sys.executable, "-c", _RUN_SEEDS, str(logdir), str(settings)],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert code.returncode == 2, code.stdout[-3000:] + code.stderr[-3000:]
    assert "seed 0: ended with exit status 2" in code.stdout and "seed 1: ended with exit status 2" in code.stdout


# `run_seeds` with an `up` option every seed's run refuses at once (--actors 0), one seed at a time.
_RUN_SEEDS = """
import sys
from rlfleet.deploy.seeds import run_seeds
sys.exit(run_seeds([0, 1], sys.argv[1], sys.argv[2], 1000, 1, ["--actors", "0"]))
"""
