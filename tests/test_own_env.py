"""A user's own env: `--env tests_env_pkg.envs:Corridor-v0` (a module that registers it with gymnasium) with
`--env-kwargs`, passed alike to the replay server, the learner, the actors and evaluation, recorded in run.json
and settings.json and checked on resume; a machine without the module is told which module it lacks."""

import json
import os
import re
import subprocess
import sys

import pytest
from helpers import ENV, ROOT, rlfleet, stop_group, wait_for

pytestmark = pytest.mark.slow

TESTS = os.path.dirname(os.path.abspath(__file__))
WITH_MODULE = dict(ENV, PYTHONPATH=TESTS)  # the package is importable: what installing it would do
WITHOUT_MODULE = {k: v for k, v in ENV.items() if k != "PYTHONPATH"}
CORRIDOR = ("--algo", "dqn", "--env", "tests_env_pkg.envs:Corridor-v0", "--set", "min_replay_size=200")


def test_own_env_with_constructor_arguments(tmp_path):
    run = tmp_path / "corridor"
    args = (*CORRIDOR, "--env-kwargs", "length=6", "--set", "eval_episodes=3", "--total-steps", 3000)
    out = rlfleet("up", *args, "--logdir", run, env=WITH_MODULE, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    env_id = 'tests_env_pkg.envs:Corridor-v0?{"length":6}'
    # One id for every process: the replay table, the learner's network and the actors' envs all have the
    # 6-cell observation (an actor whose env differed from the learner's would have refused to run).
    for name in ("run.json", "settings.json", "summary.json"):
        assert json.loads((run / name).read_text())["env_id"] == env_id, name
    summary = json.loads((run / "summary.json").read_text())
    assert summary["completed"] and summary["env_steps"] >= 3000
    # Evaluation makes the same env.
    result = tmp_path / "eval.json"
    out = rlfleet("eval", run, "--json", result, env=WITH_MODULE, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    got = json.loads(result.read_text())
    assert got["env_id"] == env_id and all(1 <= n <= 32 for n in got["lengths"])
    # Resumed with other constructor arguments: refused as another env (the algorithm, not given, is the run's),
    # nothing touched; --env-kwargs alone with --resume is asked for its --env.
    env_only = ("--env", "tests_env_pkg.envs:Corridor-v0", "--env-kwargs", "length=7")
    again = rlfleet("up", *env_only, "--resume", run, env=WITH_MODULE, timeout=300)
    assert again.returncode == 2 and '{"length":6}' in again.stderr and '{"length":7}' in again.stderr, again.stderr
    assert "--env-kwargs" in again.stderr
    again = rlfleet("up", "--env-kwargs", "length=7", "--resume", run, env=WITH_MODULE, timeout=300)
    assert again.returncode == 2 and "give --env too" in again.stderr, again.stderr
    # A machine without the module is told which one it lacks.
    out = rlfleet("eval", run, env=WITHOUT_MODULE, timeout=300)
    assert out.returncode == 2 and "the module 'tests_env_pkg.envs'" in out.stderr, out.stderr


def test_actor_machine_without_the_module_says_which(tmp_path):
    run = tmp_path / "corridor"
    up = subprocess.Popen(
        [sys.executable, "-m", "rlfleet.deploy.cli", "up", *map(str, CORRIDOR), "--total-steps", "10000000",
         "--logdir", str(run)],
        cwd=ROOT, env=WITH_MODULE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        line = wait_for(lambda: up.stdout.readline(), 180, "up's first line", [])
        while "learner at" not in line:
            line = up.stdout.readline()
            assert line, "up ended before its learner served"
        address = re.search(r"learner at (\S+)", line).group(1)
        out = rlfleet("actor", "--learner", address, env=WITHOUT_MODULE, timeout=300)
        assert out.returncode == 2, out.stdout[-3000:] + out.stderr[-3000:]
        assert "the module 'tests_env_pkg.envs'" in out.stderr and "every machine of the cluster" in out.stderr
    finally:
        stop_group(up, timeout=60)


def test_bad_env_kwargs(tmp_path):
    out = rlfleet("up", *CORRIDOR, "--env-kwargs", "length", "--total-steps", 1000, "--logdir", tmp_path / "r",
                  env=WITH_MODULE, timeout=300)  # fmt: skip
    assert out.returncode == 2 and "expected KEY=VALUE" in out.stderr, out.stderr
    out = rlfleet("up", *CORRIDOR, "--env-kwargs", "width=3", "--total-steps", 1000, "--logdir", tmp_path / "r",
                  env=WITH_MODULE, timeout=300)  # fmt: skip
    assert out.returncode == 2 and "unexpected keyword argument 'width'" in out.stderr, out.stderr
    out = rlfleet("up", "--algo", "dqn", "--env", "ALE/Pong-v5", "--env-kwargs", "mode=1", "--total-steps", 1000,
                  "--logdir", tmp_path / "r", timeout=300)  # fmt: skip
    assert out.returncode == 2 and "Atari envs take no --env-kwargs" in out.stderr, out.stderr
    assert not (tmp_path / "r" / "checkpoints").exists()


def test_an_env_that_raises_in_the_learners_evaluation_costs_that_evaluation_alone(tmp_path):
    """The learner's evaluation episodes run into a bug of the user's env (its reset raises for their seeds):
    each evaluation is skipped with the env id, the seeds and the traceback in the learner's log, training goes
    on to the budget, and the run ends as finished with its checkpoint and the error in summary.json."""
    run = tmp_path / "corridor"
    args = (*CORRIDOR, "--env-kwargs", "fail_seeds_from=500000", "--set", "eval_episodes=2", "--total-steps", 3000)
    out = rlfleet("up", *args, "--logdir", run, env=WITH_MODULE, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "skipped (episode seeds from 1000000): tests_env_pkg.envs:Corridor-v0" in out.stdout, out.stdout[-3000:]
    log = (run / "logs" / "learner.log").read_text()
    assert "RuntimeError: Corridor cannot start from seed 1000000" in log and "Traceback" in log
    summary = json.loads((run / "summary.json").read_text())
    assert summary["completed"] and summary["env_steps"] >= 3000 and summary["final_eval_return_mean"] is None
    assert "RuntimeError: Corridor cannot start from seed 1000000" in summary["final_eval_error"]
    assert (run / "checkpoints" / "checkpoint").exists()
    assert "final eval return none (tests_env_pkg.envs:Corridor-v0" in out.stdout


def test_a_nan_observation_at_reset_is_blamed_on_the_env(tmp_path):
    """A user's env whose reset returns NaN: the actor stops before the policy acts on it, naming the env and its
    reset, not the learner's training."""
    run = tmp_path / "corridor"
    args = (*CORRIDOR, "--env-kwargs", "nan_from_seed=1000", "--total-steps", 3000)
    out = rlfleet("up", *args, "--logdir", run, env=WITH_MODULE, timeout=600)
    assert out.returncode != 0, out.stdout[-3000:] + out.stderr[-3000:]
    said = "(env 0 of this actor) returned a non-finite observation in its reset after 0 env steps"
    assert said in out.stdout + out.stderr, out.stdout[-3000:] + out.stderr[-3000:]
    assert "training diverged" not in out.stdout + out.stderr


def test_evaluation_episodes_of_an_env_without_a_time_limit_are_cut_and_said_so(monkeypatch, caplog):
    """An env whose episodes never end and that has no time limit: evaluation cuts each episode at
    `MAX_EPISODE_STEPS` (one after another and batched alike) and warns, instead of running forever."""
    import logging

    import numpy as np
    import tests_env_pkg.envs  # noqa: F401  (registers the envs)

    from rlfleet.algorithms.library import evaluation

    monkeypatch.setattr(evaluation, "MAX_EPISODE_STEPS", 40)
    right = lambda obs: np.ones(len(obs), np.int64)
    with caplog.at_level(logging.WARNING, logger="rlfleet"):
        one_by_one = evaluation.run_episodes("tests_env_pkg.envs:EndlessCorridor-v0", 2, 0, right)
        batched = evaluation.run_batched_episodes("tests_env_pkg.envs:EndlessCorridor-v0", 3, 0, right)
    assert one_by_one.lengths == [40, 40] and batched.lengths == [40, 40, 40]
    assert one_by_one.returns[0] == 40 - 6  # the end cell's reward at every step from step 7 on (8 cells)
    said = [r.getMessage() for r in caplog.records if "evaluation episodes cut at 40 env steps" in r.getMessage()]
    assert len(said) == 2 and "has no time limit of its own" in said[0], said
    # An env with a time limit ends its episodes there, and nothing is said.
    caplog.clear()
    corridor = evaluation.run_episodes("tests_env_pkg.envs:Corridor-v0", 1, 0, lambda obs: np.zeros(len(obs), np.int64))
    assert corridor.lengths == [32] and not [r for r in caplog.records if "cut at" in r.getMessage()]


def test_an_env_whose_actions_do_not_start_at_0_is_refused_before_anything_starts(tmp_path):
    """`Discrete(2, start=1)`: rlfleet's actions 0..1 would be outside it; refused with the wrapper that fixes it."""
    run = tmp_path / "corridor"
    out = rlfleet("up", *CORRIDOR, "--env-kwargs", "action_start=1", "--total-steps", 1000, "--logdir", run,
                  env=WITH_MODULE, timeout=300)  # fmt: skip
    assert out.returncode == 2, out.stdout[-3000:] + out.stderr[-3000:]
    assert "its actions are 1..2 (Discrete with start=1)" in out.stderr and "TransformAction" in out.stderr
    assert not (run / "logs").exists()


def test_float64_observations_reach_the_behaviour_policy_as_float32():
    """A user's env with float64 observations far from 0 (where float64 and float32 products differ): the actors'
    collection loop gives the behaviour policy float32, as the learner, evaluation and the exported model take
    them, so that every one of them acts on the same numbers."""
    import threading
    import types

    import numpy as np
    import tests_env_pkg.envs  # noqa: F401  (registers the envs)

    from rlfleet.actors.actor import Policy
    from rlfleet.actors.adders import Act, collect
    from rlfleet.envs.core import make_batched_env

    seen, stop = [], threading.Event()

    class Builder:
        def behaviour(self, actor):
            def act(policy, obs, rng):
                seen.append(obs)
                action = np.zeros(len(obs), np.int64)
                return Act(action, action, {})

            return act

        def adder(self, actor, weights, epoch):
            steps = iter(range(5))
            return types.SimpleNamespace(
                start=lambda obs: None,
                before_step=lambda version: None,
                add=lambda step, version, serial: next(steps, None) is not None,
                close=lambda: None,
            )

    venv = make_batched_env('tests_env_pkg.envs:Corridor-v0?{"obs_offset":1000000.5}', 2, "sync")
    actor = types.SimpleNamespace(
        stop=stop,
        policy_version=-1,
        start_episodes=lambda v: (np.random.default_rng(0), v.reset(seed=[0, 1])[0]),
        check_finite=lambda obs, reward=None: None,
        count_steps=lambda reward, done: None,
    )
    weights = types.SimpleNamespace(serial=0, latest=Policy(0, {}, None))
    try:
        collect(Builder(), actor, venv, weights, 0)
    finally:
        venv.close()
    assert len(seen) == 6 and all(o.dtype == np.float32 for o in seen)
    assert seen[0][0, 0] == np.float32(1000001.5) and seen[0][0, 1] == np.float32(1000000.5)


def test_an_env_that_raises_in_an_actors_step_is_named_with_its_seeds_and_traceback(tmp_path):
    """A user's env that raises in `step` on an actor: the actor stops with the exception, the env id and the
    seeds its envs started from (its log has the traceback), and says what it collected is kept."""
    run = tmp_path / "corridor"
    args = (*CORRIDOR, "--env-kwargs", "fail_after_steps=300", "--env-backend", "sync", "--total-steps", 100000)
    out = rlfleet("up", *args, "--logdir", run, env=WITH_MODULE, timeout=600)
    assert out.returncode != 0, out.stdout[-3000:] + out.stderr[-3000:]
    said = "ValueError: Corridor broke at its step 301, raised while this actor stepped 8 x tests_env_pkg.envs:"
    assert said in out.stdout + out.stderr and "(env seeds from 1000)" in out.stdout + out.stderr, out.stderr
    log = (run / "logs" / "actor-0.log").read_text()
    assert "collection stopped by ValueError" in log and 'tests_env_pkg/envs.py", line' in log, log[-3000:]


def test_an_actor_whose_env_differs_from_the_learners_is_refused_naming_the_difference(procs, free_port, tmp_path):
    """The same env id, spaces and shapes, but another time limit on the actor's machine (another version of the
    user's package): the actor refuses to run before it makes an env, naming what differs."""
    from helpers import status_or_none, wait_for

    settings = ("--algo", "dqn", "--env", "tests_env_pkg.envs:Corridor-v0")
    replay_port, learner_port = free_port(), free_port()
    procs.start("replay", "replay", *settings, "--port", replay_port, env=WITH_MODULE)
    learner = procs.start(
        "learner", "learner", *settings, "--replay", f"127.0.0.1:{replay_port}", "--logdir", tmp_path / "run",
        "--port", learner_port, env=WITH_MODULE,
    )  # fmt: skip
    address = f"127.0.0.1:{learner_port}"
    wait_for(lambda: status_or_none(address), 180, "the learner", [learner])
    other = dict(WITH_MODULE, CORRIDOR_TIME_LIMIT="64")
    out = rlfleet("actor", "--learner", address, env=other, timeout=180)
    assert out.returncode == 2, out.stdout[-3000:] + out.stderr[-3000:]
    said = "otherwise than the learner's: time_limit: 64 here, 32 at the learner"
    assert said in out.stderr and "Nothing was written to replay" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    # The same machine's env joins.
    actor = procs.start("actor", "actor", "--learner", address, env=WITH_MODULE)
    wait_for(lambda: (s := status_or_none(address)) and s["env_steps"] > 0, 180, "the matching actor", [actor])


@pytest.mark.parametrize("backend, hang", [("sync", "loop"), ("workers", "sleep")])
def test_an_env_that_hangs_in_an_actors_step_is_reported_and_the_actor_stops(tmp_path, backend, hang):
    """A user's env whose `step` never returns on an actor (stuck in its own Python loop in the actor process, or
    in a system call in a worker process): after --env-timeout the actor's log names the env, its seeds and where
    it hangs, and the actor stops naming the hang (its worker processes ended), instead of collecting nothing
    for ever."""
    run = tmp_path / "corridor"
    kwargs = ("--env-kwargs", "hang_after_steps=300", "--env-kwargs", f"hang={hang}")
    args = (*CORRIDOR, *kwargs, "--env-backend", backend, "--env-timeout", 3, "--total-steps", 10**5)
    out = rlfleet("up", *args, "--logdir", run, env=WITH_MODULE, timeout=600)
    assert out.returncode != 0, out.stdout[-3000:] + out.stderr[-3000:]
    said = "its step() did not return within 3 s (8 envs, seeds from 1000; --env-timeout sets the limit); the env"
    assert said in out.stderr and "this actor stopped after" in out.stderr, out.stdout[-3000:] + out.stderr[-3000:]
    log = (run / "logs" / "actor-0.log").read_text()
    assert "Where it hangs:" in log and "collection stopped by EnvHang" in log, log[-3000:]
    if backend == "sync":  # the env's own frame; a worker process's stack is not the actor's to show
        assert 'tests_env_pkg/envs.py", line' in log.split("Where it hangs:")[1], log[-3000:]


def test_an_env_that_hangs_in_the_learners_evaluation_costs_that_evaluation_alone(tmp_path):
    """The learner's evaluation episodes hang in the user's env (its reset never returns for their seeds): each
    evaluation is cut after --env-timeout and skipped with the env id, the seeds and where it hung in the
    learner's log, training goes on to the budget, and the run ends as finished; `rlfleet eval` of it exits 2
    with the same message."""
    run = tmp_path / "corridor"
    args = (*CORRIDOR, "--env-kwargs", "hang_seeds_from=500000", "--set", "eval_episodes=2", "--env-timeout", 2)
    out = rlfleet("up", *args, "--total-steps", 3000, "--logdir", run, env=WITH_MODULE, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    said = "its reset() did not return within 2 s (2 envs, seeds from 1000000;"
    assert said in out.stdout, out.stdout[-3000:]
    log = (run / "logs" / "learner.log").read_text()
    assert "Where it hangs:" in log and 'tests_env_pkg/envs.py", line' in log, log[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["completed"] and summary["env_steps"] >= 3000 and said in summary["final_eval_error"]
    again = rlfleet("eval", run, "--episodes", 1, "--env-timeout", 1, env=WITH_MODULE, timeout=300)
    assert again.returncode == 2 and "its reset() did not return within 1 s" in again.stderr, again.stderr[-3000:]


def test_a_nan_observation_in_the_learners_evaluation_is_blamed_on_the_env(tmp_path):
    """A user's env that returns NaN in the learner's evaluation episodes (not in the actors'): the evaluation is
    skipped naming the env and where, never scored as a return, and training goes on."""
    run = tmp_path / "corridor"
    args = (*CORRIDOR, "--env-kwargs", "nan_from_seed=500000", "--set", "eval_episodes=2", "--total-steps", 3000)
    out = rlfleet("up", *args, "--logdir", run, env=WITH_MODULE, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    said = "returned a non-finite observation in its reset (env seeds from 1000000); fix the env (or its wrappers)"
    assert said in out.stdout, out.stdout[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["completed"] and summary["final_eval_return_mean"] is None and said in summary["final_eval_error"]


def test_an_env_that_hangs_while_the_actor_chooses_its_backend_is_reported(tmp_path):
    """The default backend `auto` makes and steps the envs to measure the backends before collecting: an env whose
    seeded reset hangs there is reported and stops the actor as in collection, instead of an actor that never
    collects but stays listed as alive."""
    run = tmp_path / "corridor"
    args = (*CORRIDOR, "--env-kwargs", "hang_seeds_from=1", "--env-timeout", 3, "--total-steps", 10**5)
    out = rlfleet("up", *args, "--logdir", run, env=WITH_MODULE, timeout=600)
    assert out.returncode != 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "did not return within 3 s" in out.stderr, out.stdout[-3000:] + out.stderr[-3000:]
    log = (run / "logs" / "actor-0.log").read_text()
    assert "Where it hangs:" in log and 'tests_env_pkg/envs.py", line' in log, log[-3000:]


def test_an_env_whose_kwargs_check_hangs_is_refused_before_anything_starts(tmp_path):
    """`up` resets and steps an env given --env-kwargs once before it starts anything; an env that hangs there is
    interrupted after --env-timeout and refused (exit 2) naming the hang, instead of a command that never
    returns."""
    run = tmp_path / "corridor"
    args = (*CORRIDOR, "--env-kwargs", "hang_seeds_from=-1", "--env-timeout", 2, "--total-steps", 1000)
    out = rlfleet("up", *args, "--logdir", run, env=WITH_MODULE, timeout=300)
    assert out.returncode == 2, out.stdout[-3000:] + out.stderr[-3000:]
    said = "its first reset or step (the check of --env-kwargs) did not return within 2 s (env seed 0;"
    assert said in out.stderr and not run.exists(), out.stderr[-3000:]
