"""Run records (benchmarks/report.py): a few-KB stand-in for a run directory, so benchmark results outlive the
run directories (an Atari run's checkpoints and replay are GBs); and how benchmarks/reincarnation.py reuses them."""

import json
import os
import subprocess
import sys

import pytest

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
sys.path.insert(0, BENCHMARKS)
import reincarnation  # noqa: E402
import report  # noqa: E402


def _write_run(d, *, completed=True, total_steps=3000, algo="dqn"):
    """A run directory as the learner leaves it: summary.json and metrics.jsonl (a row per report, each
    repeating the latest evaluation)."""
    os.makedirs(d)
    evals = [None, None, 10.0, 10.0, 10.0, 35.5, 35.5, 20.0, 20.0, 60.0]
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        for i, e in enumerate(evals):
            f.write(json.dumps(dict(env_steps=300 * (i + 1), learner_steps=40 * i, eval_return_mean=e, loss=0.1)))
            f.write("\n")
    summary = dict(
        algo=algo,
        env_id="CartPole-v1",
        completed=completed,
        env_steps=3000,
        total_steps=total_steps,
        final_eval_return_mean=71.0 if completed else None,
    )
    with open(os.path.join(d, "summary.json"), "w") as f:
        json.dump(summary, f)


def test_a_record_scores_and_plots_as_its_run_directory(tmp_path):
    d = str(tmp_path / "CartPole-v1-dqn-s1")
    _write_run(d)
    (run,) = report.load_runs([d])
    record = str(tmp_path / "records" / "CartPole-v1-dqn-s1.json")
    report.save_record(run, record, command="rlfleet up ...")
    (back,) = report.load_runs([record])
    with open(record) as f:
        saved = json.load(f)
    assert saved["run"] == "CartPole-v1-dqn-s1" and saved["command"] == "rlfleet up ..."
    # One row per evaluation, placed at the first row that reported it; no other metrics.
    assert [(r["env_steps"], r["eval_return_mean"]) for r in back["rows"]] == [
        (900, 10.0),
        (1800, 35.5),
        (2400, 20.0),
        (3000, 60.0),
    ]
    assert back["summary"] == run["summary"]
    for at in (800, 900, 2000, 2999, 3000, None):
        try:
            expected = report.run_score(run, at)
        except ValueError:
            with pytest.raises(ValueError):
                report.run_score(back, at)
            continue
        assert report.run_score(back, at) == expected
    assert report.eval_points(back["rows"]) == report.eval_points(run["rows"])
    assert report.run_name(record) == report.run_name(d) == "CartPole-v1-dqn-s1"


def test_finished_runs_are_found_in_their_directory_then_their_record(tmp_path):
    records = str(tmp_path / "records")
    d = str(tmp_path / "CartPole-v1-dqn-s1")
    assert reincarnation.finished_source(d, 3000, records) is None  # nothing yet: it has to run
    _write_run(d)
    assert reincarnation.finished_source(d, 3000, records) == d
    assert reincarnation.finished_source(d, 5000, records) is None  # a larger budget: it continues
    (run,) = report.load_runs([d])
    report.save_record(run, os.path.join(records, "CartPole-v1-dqn-s1.json"))
    os.rename(d, d + "-gone")
    assert reincarnation.finished_source(d, 3000, records) == os.path.join(records, "CartPole-v1-dqn-s1.json")
    assert reincarnation.finished_source(d, 3000, None) is None
    stopped = str(tmp_path / "CartPole-v1-dqn-s2")
    _write_run(stopped, completed=False)  # a run stopped with Ctrl-C is not finished
    assert reincarnation.finished_source(stopped, 3000, records) is None


def test_students_without_their_teachers_directory_stop_before_any_run(tmp_path):
    """Only the teacher's record is left: the students cannot be taught, and the script says so at once
    (it starts no run and does not retrain a different teacher under the old one's name)."""
    records, workdir = str(tmp_path / "records"), str(tmp_path / "work")
    teacher = str(tmp_path / "CartPole-v1-dqn-s0")
    _write_run(teacher, total_steps=3000)
    (run,) = report.load_runs([teacher])
    report.save_record(run, os.path.join(records, "CartPole-v1-dqn-s0.json"))
    cmd = [sys.executable, os.path.join(BENCHMARKS, "reincarnation.py"), "--teacher-steps", "3000"]
    cmd += ["--student-steps", "1000", "--scratch-seeds", "1", "--records", records, "--workdir", workdir]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "the teacher's run directory" in out.stderr and "--teacher-seed" in out.stderr, out.stderr
    assert not os.path.exists(workdir) or os.listdir(workdir) == []


def _record(records, name, algo, evals, total_steps, final, **summary):
    """A record as save_record writes it: evaluations [(env steps, return)], the run's budget and final return."""
    rows = [dict(env_steps=n, learner_steps=None, eval_return_mean=v) for n, v in evals]
    s = dict(algo=algo, env_id="CartPole-v1", completed=True, env_steps=total_steps + 8, total_steps=total_steps)
    s.update(final_eval_return_mean=final, **summary)
    os.makedirs(records, exist_ok=True)
    with open(os.path.join(records, name + ".json"), "w") as f:
        json.dump(dict(run=name, summary=s, rows=rows), f)


def test_the_reincarnation_table_from_records_alone(tmp_path):
    """Every run finished and only its record left: the script runs nothing and reports from the records; a
    DQN run longer than the scratch budget (an earlier teacher reused) is compared as it stood at that budget."""
    records, workdir = str(tmp_path / "records"), str(tmp_path / "work")
    os.makedirs(workdir)
    # Teacher seed 2 (500 steps); scratch seeds 0 and 1, seed 0 a longer run (900 steps) that reached the
    # target only after the 500-step budget.
    _record(records, "CartPole-v1-dqn-s2", "dqn", [(100, 9.0), (300, 60.0), (500, 200.0)], 500, 200.0)
    _record(records, "CartPole-v1-dqn-s0", "dqn", [(100, 9.0), (400, 90.0), (700, 190.0)], 900, 195.0)
    _record(records, "CartPole-v1-dqn-s1", "dqn", [(100, 9.0), (200, 150.0), (400, 185.0)], 500, 185.0)
    teacher = dict(teacher_eval_return_mean=200.0, random_eval_return_mean=20.0)
    _record(records, "CartPole-v1-qdagger-t2-s0", "qdagger", [(0, 120.0), (50, 190.0)], 100, 195.0, **teacher)
    _record(records, "CartPole-v1-qdagger-t2-s1", "qdagger", [(0, 100.0), (60, 150.0)], 100, 160.0, **teacher)
    cmd = [sys.executable, os.path.join(BENCHMARKS, "reincarnation.py"), "--teacher-steps", "500"]
    cmd += ["--student-steps", "100", "--scratch-steps", "500", "--seeds", "2", "--scratch-seeds", "3"]
    cmd += ["--teacher-seed", "2", "--fraction", "0.9", "--records", records, "--workdir", workdir]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "$ rlfleet up" not in out.stdout  # nothing ran
    with open(os.path.join(workdir, "CartPole-v1-reincarnation.json")) as f:
        result = json.load(f)
    assert result["target"] == pytest.approx(20.0 + 0.9 * 180.0)  # 182
    reach = {t["run"]: t["env_steps_to_target"] for t in result["runs"]}
    # The seed-0 run reached 182 only at 700 steps, past the 500-step budget: it never reached it within it.
    assert reach == {
        "CartPole-v1-dqn-s2": 500,
        "CartPole-v1-dqn-s0": None,
        "CartPole-v1-dqn-s1": 400,
        "CartPole-v1-qdagger-t2-s0": 50,
        "CartPole-v1-qdagger-t2-s1": None,
    }
    finals = {t["run"]: t["final_eval_return"] for t in result["runs"]}
    assert finals["CartPole-v1-dqn-s0"] == 90.0  # its latest evaluation by 500 steps, not its 195 at 900
    # Medians with the runs that never reached the target counted at their budgets (lower bounds).
    assert result["median_steps_dqn"] == 500 and result["median_steps_qdagger"] == 75
    assert result["scratch_censored"] and result["students_censored"]


def test_records_of_other_settings_or_too_short_stop_before_any_run(tmp_path):
    records, workdir = str(tmp_path / "records"), str(tmp_path / "work")
    os.makedirs(workdir)
    base = [sys.executable, os.path.join(BENCHMARKS, "reincarnation.py"), "--teacher-steps", "500"]
    base += ["--student-steps", "100", "--seeds", "1", "--scratch-seeds", "1", "--records", records]
    base += ["--workdir", workdir]
    _record(records, "CartPole-v1-dqn-s0", "dqn", [(500, 200.0)], 500, 200.0)
    teacher = dict(teacher_eval_return_mean=200.0, random_eval_return_mean=20.0)
    _record(records, "CartPole-v1-qdagger-s0", "qdagger", [(50, 190.0)], 100, 195.0, **teacher)
    with open(os.path.join(records, "CartPole-v1-dqn-s0.json")) as f:
        record = json.load(f)
    record["args"] = ["--algo", "dqn", "--env", "CartPole-v1", "--seed", "0", "--set", "learning_rate=0.01"]
    with open(os.path.join(records, "CartPole-v1-dqn-s0.json"), "w") as f:
        json.dump(record, f)
    out = subprocess.run(base, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "learning_rate=0.01" in out.stderr and "another --records" in out.stderr, out
    # Asked for more env steps than the record holds, with the run's directory gone: it cannot continue.
    out = subprocess.run(base + ["--set", "learning_rate=0.01"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr  # the same settings: reused
    longer = [a if a != "500" else "800" for a in base] + ["--set", "learning_rate=0.01"]
    out = subprocess.run(longer, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "only its record is left" in out.stderr, out
    # No run was started: the workdir holds only the first (reusing) invocation's report files, no run directory.
    assert "$ rlfleet up" not in out.stdout and not any(
        os.path.isdir(os.path.join(workdir, n)) for n in os.listdir(workdir)
    )


def test_every_method_against_tabula_rasa_and_each_other_from_records(tmp_path):
    """--methods: students of each method from the same teacher, each against DQN from scratch and against each
    other, with the probability of improvement at the students' budget (rliable) and a ratio of median env steps
    per method."""
    records, workdir = str(tmp_path / "records"), str(tmp_path / "work")
    os.makedirs(workdir)
    teacher = dict(teacher_eval_return_mean=200.0, random_eval_return_mean=20.0)
    for s in range(3):
        _record(records, f"CartPole-v1-dqn-s{s}", "dqn", [(100, 9.0), (400, 100.0 + s)], 500, 150.0)
        _record(records, f"CartPole-v1-qdagger-s{s}", "qdagger", [(0, 150.0), (50, 195.0 + s)], 100, 196.0, **teacher)
        _record(records, f"CartPole-v1-dqfd-s{s}", "dqfd", [(0, 30.0), (80, 60.0 + s)], 100, 70.0, **teacher)
    cmd = [sys.executable, os.path.join(BENCHMARKS, "reincarnation.py"), "--teacher-steps", "500"]
    cmd += ["--student-steps", "100", "--seeds", "3", "--methods", "qdagger,dqfd", "--fraction", "0.9"]
    cmd += ["--records", records, "--workdir", workdir]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "$ rlfleet up" not in out.stdout
    with open(os.path.join(workdir, "CartPole-v1-reincarnation.json")) as f:
        result = json.load(f)
    assert result["median_steps_qdagger"] == 50 and result["median_steps_dqfd"] == 100 and result["dqfd_censored"]
    pairs = {(c["x"], c["y"]): c["probability_of_improvement"] for c in result["comparisons"]}
    # At 100 env steps: QDagger's students 195-197, DQfD's 60-62, DQN from scratch 9 (its latest by then).
    assert pairs[("qdagger", "dqn")][0] == 1.0 and pairs[("dqfd", "dqn")][0] == 1.0
    assert pairs[("qdagger", "dqfd")][0] == 1.0
