"""benchmarks/code_ab.py: one `rlfleet up` command under two interpreters (here both this checkout's), every run
timed and reported per version, finished runs kept when the same command runs again."""

import json
import os
import subprocess
import sys

import pytest
from helpers import ENV, ROOT

pytestmark = pytest.mark.slow

SCRIPT = os.path.join(ROOT, "benchmarks", "code_ab.py")


def _script(*args, timeout=600):
    return subprocess.run(
        [sys.executable, SCRIPT, *map(str, args)], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout
    )


def test_two_versions_side_by_side_and_a_second_run_keeps_the_finished_ones(tmp_path):
    out = tmp_path / "ab"
    relative = os.path.relpath(sys.executable, ROOT)  # from where the script runs: made absolute by it
    versions = ["--version", f"a={sys.executable}", "--version", f"b={relative}"]
    up = ["--", "--algo", "dqn", "--env", "CartPole-v1", "--total-steps", 1000, "--set", "min_replay_size=200"]
    done = _script("run", *versions, "--seeds", 3, "--out", out, *up)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(os.listdir(out)) == ["a-s3", "b-s3"]
    report = tmp_path / "ab.json"
    assert _script("report", out, "--json", report).returncode == 0
    result = json.loads(report.read_text())
    assert set(result["versions"]) == {"a", "b"}
    for name, v in result["versions"].items():
        [r] = v["runs"]
        assert r["seed"] == 3 and r["env_steps"] >= 1000 and r["process_wall_seconds"] > r["run_wall_seconds"] > 0
        assert r["command"][:4] == [os.path.abspath(sys.executable), "-m", "rlfleet.deploy.cli", "up"]
        assert r["command"][-4:] == ["--seed", "3", "--logdir", str(out / f"{name}-s3")]
        assert v["returns"]["iqm"] == r["final_eval_return_mean"]
    again = _script("run", *versions, "--seeds", 3, "--out", out, *up)
    assert again.returncode == 0 and again.stdout.count("finished earlier, kept") == 2, again.stdout[-2000:]


def test_the_scripts_own_options_are_refused_after_the_separator(tmp_path):
    bad = _script("run", "--version", f"a={sys.executable}", "--out", tmp_path, "--", "--seed", 1, timeout=60)
    assert bad.returncode == 2 and "give --seeds and --out instead" in bad.stderr
    bad = _script("run", "--version", "a", "--out", tmp_path, timeout=60)
    assert bad.returncode == 2 and "give NAME=PYTHON" in bad.stderr
    bad = _script("run", "--version", f"a={tmp_path / 'nowhere' / 'python'}", "--out", tmp_path, timeout=60)
    assert bad.returncode == 2 and "is not an interpreter here" in bad.stderr
