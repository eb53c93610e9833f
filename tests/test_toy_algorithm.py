"""An algorithm defined outside rlfleet (`tests/toy_algorithm.py`) runs through `rlfleet up` to a finished run,
as a plugin ($RLFLEET_PLUGINS) and as a built-in (one folder under `algorithms/` plus one line in the registry).
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import subprocess
import sys
import tomllib

import numpy as np
import pytest

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOY = os.path.join(ROOT, "tests", "toy_algorithm.py")


def _rlfleet(*args, timeout=600):
    env = dict(os.environ, RLFLEET_PLUGINS=TOY)
    cmd = [sys.executable, "-m", "rlfleet.deploy.cli", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def _package_with_the_toy_built_in(tmp_path) -> str:
    """A copy of the rlfleet package whose `algorithms/` holds the toy as one more folder and whose registry names
    it in one more line; returns the folder to put on PYTHONPATH (it comes before the installed package)."""
    src = tmp_path / "src"
    package = src / "rlfleet"
    package.mkdir(parents=True)
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        folders = tomllib.load(f)["tool"]["setuptools"]["package-dir"]  # rlfleet.<part> -> folder
    for name, folder in folders.items():
        part = name.split(".", 1)[1]
        if part != "algorithms":
            (package / part).symlink_to(os.path.join(ROOT, folder))
    shutil.copytree(os.path.join(ROOT, folders["rlfleet.algorithms"]), package / "algorithms",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    (package / "algorithms" / "toy_reinforce").mkdir()
    shutil.copy(TOY, package / "algorithms" / "toy_reinforce" / "__init__.py")
    registry = package / "algorithms" / "__init__.py"
    before = registry.read_text()
    last = '    "rlfleet.algorithms.qdagger",\n'
    after = before.replace(last, last + '    "rlfleet.algorithms.toy_reinforce",\n')
    changed = [line for line in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
               if line[:1] in "+-" and not line.startswith(("+++", "---"))]  # fmt: skip
    assert changed == ['+    "rlfleet.algorithms.toy_reinforce",'], changed
    registry.write_text(after)
    return str(src)


@pytest.mark.parametrize("how", ["plugin", "builtin"])
def test_toy_algorithm_runs_to_a_finished_run(tmp_path, how):
    """The toy as a plugin ($RLFLEET_PLUGINS, which `up` passes on to its processes) and as a built-in (one folder
    and one registry line, no $RLFLEET_PLUGINS) runs through `rlfleet up` to a finished run that learned."""
    if how == "plugin":
        env = dict(os.environ, RLFLEET_PLUGINS=TOY)
    else:
        env = dict(os.environ, PYTHONPATH=_package_with_the_toy_built_in(tmp_path))
        env.pop("RLFLEET_PLUGINS", None)
        where = subprocess.run(
            [sys.executable, "-c", "from rlfleet import algorithms; print(algorithms.names(), algorithms.__file__)"],
            capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
        )  # fmt: skip
        assert where.returncode == 0, where.stderr
        builtins = "['ppo', 'dqn', 'qdagger', 'kickstarting', 'pretrain_finetune', 'rehearsal', 'dqfd', 'jsrl', 'toy_"
        assert where.stdout.startswith(builtins) and str(tmp_path) in where.stdout
    run = tmp_path / "run"
    out = subprocess.run(
        [sys.executable, "-m", "rlfleet.deploy.cli", "up", "--algo", "toy_reinforce", "--env", "CartPole-v1",
         "--total-steps", "40000", "--logdir", str(run), "--report-interval", "1"],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["algo"] == "toy_reinforce" and summary["completed"] and summary["env_steps"] >= 40_000
    # One update per item consumed (the run ends on the actors' count, with a few items still queued).
    assert summary["consumed_env_steps"] == summary["learner_steps"] * 8 * 64 and summary["learner_steps"] >= 40
    assert "policy entropy" in out.stdout  # the definition's progress key, from the status map
    assert 0 < summary["policy_entropy"] < np.log(2)  # it moved away from the uniform policy
    # The policy learned: its greedy action at the start (zero weights: always action 0) scores about 9, a
    # learned one several times that.
    assert summary["final_eval_return_mean"] >= 60, summary
    run_json = json.loads((run / "run.json").read_text())
    assert run_json["algo"] == "toy_reinforce" and run_json["config"]["learning_rate"] == 1.0


def test_toy_algorithm_settings_and_unknown_names():
    shown = _rlfleet("up", "--algo", "toy_reinforce", "--env", "CartPole-v1", "--show-config", timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "gradient ascent step size (per update)" in shown.stdout
    wrong_env = _rlfleet(
        "up", "--algo", "toy_reinforce", "--env", "Pendulum-v1", "--total-steps", 1000, "--logdir", "/nonexistent",
        timeout=120,
    )  # fmt: skip
    assert wrong_env.returncode == 2 and "needs discrete actions" in wrong_env.stderr
    unknown = _rlfleet("up", "--algo", "impala", "--env", "CartPole-v1", "--show-config", timeout=120)
    assert unknown.returncode == 2
    registered = "ppo, dqn, qdagger, kickstarting, pretrain_finetune, rehearsal, dqfd, jsrl, toy_reinforce"
    assert f"--algo impala: no such algorithm (registered: {registered})" in unknown.stderr


def test_a_plugin_that_fails_or_is_missing_is_named(procs, free_port, tmp_path):
    from helpers import ENV, wait_for

    broken = tmp_path / "broken_plugin.py"
    broken.write_text("raise RuntimeError('boom in the plugin')\n")
    env = dict(os.environ, RLFLEET_PLUGINS=f"{TOY},{broken}")
    cmd = [sys.executable, "-m", "rlfleet.deploy.cli", "up", "--algo", "ppo", "--env", "Hopper-v5", "--show-config"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 2 and "cannot import the algorithm plugin" in out.stderr
    assert "broken_plugin.py" in out.stderr and "boom in the plugin" in out.stderr
    # A learner that runs the plugin's algorithm, and an actor machine that lacks the plugin.
    replay_port, learner_port = free_port(), free_port()
    run_config = tmp_path / "settings.json"
    with_plugin = dict(ENV, RLFLEET_PLUGINS=TOY)
    written = _rlfleet("settings", "--algo", "toy_reinforce", "--env", "CartPole-v1", "--out", run_config)
    assert written.returncode == 0, written.stderr
    replay = procs.start("replay", "replay", "--run-config", run_config, "--port", replay_port, env=with_plugin)
    learner = procs.start(
        "learner", "learner", "--run-config", run_config, "--replay", f"127.0.0.1:{replay_port}",
        "--logdir", tmp_path / "run", "--port", learner_port, env=with_plugin,
    )  # fmt: skip
    wait_for(lambda: "serving on" in learner.output(), 120, "the learner", [replay, learner])
    actor = procs.start("actor", "actor", "--learner", f"127.0.0.1:{learner_port}")  # no RLFLEET_PLUGINS
    assert actor.proc.wait(timeout=120) == 2
    assert "runs algorithm 'toy_reinforce', which this machine cannot run" in actor.output()
    assert "RLFLEET_PLUGINS" in actor.output()
