"""The "workers" env backend (worker processes of several envs each) steps exactly as the in-process batch does,
and `--env-backend auto` chooses by measurement, says why, and keeps a named backend (a few seconds each)."""

import functools
import os
import threading

import numpy as np
import pytest
from helpers import rlfleet, status_or_none, wait_for

from rlfleet.actors.backend_choice import SWITCH_MARGIN, WORKER_ROUND_TRIP_S, choose_backend
from rlfleet.envs.core import EnvError, env_with_kwargs, make_batched_env, make_env, truncation_observations
from rlfleet.envs.workers import WorkerVectorEnv, _cgroup_cpu_limit, worker_count

TESTS = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def own_env_importable(monkeypatch):
    """The tests' own env package importable here and in spawned worker processes (as installing it would)."""
    monkeypatch.setenv("PYTHONPATH", TESTS + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.syspath_prepend(TESTS)


def test_worker_count_divides_the_envs_within_the_cores():
    assert worker_count(8, cores=2) == 2 and worker_count(8, cores=3) == 2 and worker_count(8, cores=16) == 8
    assert worker_count(6, cores=4) == 3 and worker_count(7, cores=4) == 1 and worker_count(1, cores=8) == 1
    with pytest.raises(ValueError, match="divides the envs per actor"):
        WorkerVectorEnv([functools.partial(make_env, "CartPole-v1")] * 6, num_workers=4)


@pytest.mark.parametrize(
    "proc_line, files, cores",
    [
        # cgroup v2: the quota of a parent cgroup (a systemd unit's CPUQuota, a pod's) caps its children
        (
            "0::/pod/app",
            {"cpu.max": "max 100000", "pod/cpu.max": "150000 100000", "pod/app/cpu.max": "max 100000"},
            1.5,
        ),
        ("0::/pod/app", {"cpu.max": "max 100000", "pod/app/cpu.max": "50000 100000"}, 0.5),
        ("0::/", {"cpu.max": "max 100000"}, None),
        # a path of another cgroup namespace, not under this mount: the mount's root counts
        ("0::/elsewhere", {"cpu.max": "200000 100000"}, 2.0),
        # cgroup v1
        (
            "4:cpu,cpuacct:/job",
            {
                "cpu/cpu.cfs_quota_us": "-1",
                "cpu/cpu.cfs_period_us": "100000",
                "cpu/job/cpu.cfs_quota_us": "300000",
                "cpu/job/cpu.cfs_period_us": "100000",
            },
            3.0,
        ),
        ("4:cpu,cpuacct:/", {}, None),
    ],
)
def test_the_cpu_quota_is_the_smallest_along_the_cgroup_path(tmp_path, proc_line, files, cores):
    proc = tmp_path / "cgroup"
    proc.write_text(proc_line + "\n")
    for name, text in files.items():
        (tmp_path / "fs" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "fs" / name).write_text(text + "\n")
    assert _cgroup_cpu_limit(str(proc), str(tmp_path / "fs")) == cores


@pytest.mark.parametrize("env_id, workers", [("CartPole-v1", 2), ("Pendulum-v1", 3)])
def test_workers_step_like_the_in_process_batch(env_id, workers):
    """Same seeds and actions: the same observations, rewards, terminations, truncations and final observations,
    env by env, whichever worker holds it (discrete and continuous actions; CartPole ends early, Pendulum at its
    time limit)."""
    num_envs = 6
    sync = make_batched_env(env_id, num_envs, "sync")
    pool = WorkerVectorEnv([functools.partial(make_env, env_id)] * num_envs, num_workers=workers)
    try:
        assert pool.single_observation_space == sync.single_observation_space
        assert pool.single_action_space == sync.single_action_space
        seeds = list(range(100, 100 + num_envs))
        a, _ = sync.reset(seed=seeds)
        b, _ = pool.reset(seed=seeds)
        np.testing.assert_array_equal(a, b)
        sync.action_space.seed(1)
        ends = 0
        for _ in range(260):
            actions = sync.action_space.sample()
            ra = sync.step(actions)
            rb = pool.step(actions)
            for x, y in zip(ra[:4], rb[:4]):
                np.testing.assert_array_equal(x, y)
            assert rb[0].shape == (num_envs, *sync.single_observation_space.shape) and rb[1].dtype == np.float64
            np.testing.assert_array_equal(
                truncation_observations(*ra[0:1], ra[2], ra[3], ra[4]),
                truncation_observations(*rb[0:1], rb[2], rb[3], rb[4]),
            )
            done = ra[2] | ra[3]
            ends += int(done.sum())
            if done.any():
                assert np.array_equal(np.asarray(rb[4]["_final_obs"], bool), done)
                for i in np.flatnonzero(done):
                    np.testing.assert_array_equal(rb[4]["final_obs"][i], ra[4]["final_obs"][i])
        assert ends >= num_envs  # every env finished at least one episode on the way
    finally:
        sync.close()
        pool.close()


def test_auto_keeps_a_cheap_env_in_process_and_says_why(monkeypatch):
    import rlfleet.actors.backend_choice as backend_choice

    # A batch step far below the round trips of the processes that would share it: none could pay for it.
    monkeypatch.setattr(backend_choice, "seconds_per_batch_step", lambda venv, seconds=None: 50e-6)
    venv, choice = choose_backend("CartPole-v1", 4, cores=2)
    try:
        assert choice.backend == "sync" and venv.num_envs == 4
        assert set(choice.seconds_per_batch_step) == {"sync"}
        assert choice.reason.startswith("sync: fastest measured") and "workers not tried" in choice.reason
    finally:
        venv.close()


def test_an_actor_stopping_while_it_chooses_still_gets_the_in_process_batch(monkeypatch):
    """SIGTERM before or while auto measures: sync, always there, is measured and kept; no other is tried."""
    import rlfleet.actors.backend_choice as backend_choice

    monkeypatch.setattr(backend_choice, "_envpool_has", lambda env_id: True)  # a candidate it would try
    stop = threading.Event()
    stop.set()
    venv, choice = choose_backend("Pendulum-v1", 4, cores=2, stop=stop)
    try:
        assert choice.backend == "sync" and set(choice.seconds_per_batch_step) == {"sync"}
        assert "; envpool not tried: the actor is stopping" in choice.reason, choice.reason
    finally:
        venv.close()


def test_a_candidate_that_cannot_step_the_env_is_left_out_with_its_reason(monkeypatch):
    import rlfleet.actors.backend_choice as backend_choice

    monkeypatch.setattr(backend_choice, "_envpool_has", lambda env_id: True)  # envpool refuses discrete actions
    venv, choice = choose_backend("CartPole-v1", 2, cores=1)
    try:
        assert choice.backend == "sync" and set(choice.seconds_per_batch_step) == {"sync"}
        assert (
            "; envpool not usable (EnvError: the envpool backend handles Box" in choice.reason
            and "leave --env-backend" not in choice.reason
            and "workers not tried: only 1 usable core" in choice.reason
        )
    finally:
        venv.close()
    with pytest.raises(EnvError, match="NoSuchEnv-v0"):  # the env itself cannot be made: nothing to choose from
        choose_backend("NoSuchEnv-v0", 2)


@pytest.mark.parametrize(
    "env_id, default, other, other_ms, chosen",
    [
        ("CartPole-v1", "sync", "workers", 0.95, "sync"),  # a near-tie: the default stays
        ("CartPole-v1", "sync", "workers", 0.85, "workers"),  # faster by more than the margin
        ("HalfCheetah-v5", "envpool", "sync", 0.95, "envpool"),
        ("HalfCheetah-v5", "envpool", "sync", 0.85, "sync"),
    ],
)
def test_auto_keeps_the_default_backend_unless_another_is_faster_by_the_margin(
    monkeypatch, env_id, default, other, other_ms, chosen
):
    """Backends about as fast as the default (envpool where it steps the env, else sync) do not take its place:
    short timings vary from one start to the next, and the choice should not."""
    import rlfleet.actors.backend_choice as backend_choice

    assert 0.85 * (1 + SWITCH_MARGIN) < 1.0 < 0.95 * (1 + SWITCH_MARGIN)  # the cases straddle the margin

    def timed(venv, seconds=None):  # the default takes 1 ms per batch step, `other` other_ms; any third 5 ms
        backend = "workers" if isinstance(venv, WorkerVectorEnv) else "sync" if hasattr(venv, "envs") else "envpool"
        return {default: 1.0, other: other_ms}.get(backend, 5.0) * 1e-3

    monkeypatch.setattr(backend_choice, "seconds_per_batch_step", timed)
    venv, choice = choose_backend(env_id, 4, cores=2)
    try:
        assert choice.backend == chosen, choice
        assert choice.seconds_per_batch_step[default] == 1e-3
        said = "fastest measured" if chosen == other else f"the default for this env, within {SWITCH_MARGIN:.0%}"
        assert choice.reason.startswith(f"{chosen}") and said in choice.reason, choice.reason
    finally:
        venv.close()


def test_auto_keeps_the_in_process_batch_over_workers_about_as_fast_when_the_default_lost(monkeypatch):
    """Where envpool (the default) measured slower, sync and workers within the margin of each other go by
    preference too: sync, with no processes to start, stays."""
    import rlfleet.actors.backend_choice as backend_choice

    def timed(venv, seconds=None):
        backend = "workers" if isinstance(venv, WorkerVectorEnv) else "sync" if hasattr(venv, "envs") else "envpool"
        return {"envpool": 2.0, "sync": 1.0, "workers": 0.95}[backend] * 1e-3

    monkeypatch.setattr(backend_choice, "seconds_per_batch_step", timed)
    venv, choice = choose_backend("HalfCheetah-v5", 4, cores=2)
    try:
        assert choice.backend == "sync" and set(choice.seconds_per_batch_step) == {"envpool", "sync", "workers"}
        assert choice.reason.startswith(f"sync: in the actor process, within {SWITCH_MARGIN:.0%}"), choice.reason
    finally:
        venv.close()


def test_auto_measures_workers_for_an_expensive_env_and_keeps_the_fastest(own_env_importable):
    env_id = env_with_kwargs("tests_env_pkg.envs:Corridor-v0", {"busy_seconds": 0.002})
    venv, choice = choose_backend(env_id, 4, cores=2)
    try:
        timings = choice.seconds_per_batch_step
        assert set(timings) == {"sync", "workers"}
        assert timings["sync"] >= 4 * 0.002 > WORKER_ROUND_TRIP_S  # four CPU-bound steps in a row
        faster = timings["workers"] * (1 + SWITCH_MARGIN) < timings["sync"]
        assert choice.backend == ("workers" if faster else "sync")  # open and ready
        assert isinstance(venv, WorkerVectorEnv) == (choice.backend == "workers")
        obs, _ = venv.reset(seed=[0, 1, 2, 3])
        assert obs.shape == (4, 8)
        for backend, seconds in timings.items():
            assert f"{backend} {seconds * 1e3:.3g} ms" in choice.reason
    finally:
        venv.close()


@pytest.mark.slow
def test_auto_reports_its_choice_and_why_in_the_actors_log_and_the_learners_status(procs, free_port, tmp_path):
    from test_services import start_replay_and_learner

    replay, learner, address, _, _ = start_replay_and_learner(procs, free_port, tmp_path)
    actor = procs.start("actor", "actor", "--learner", address)  # the run's backend: auto
    st = wait_for(
        lambda: (s := status_or_none(address)) and s["actors"] and s["actors"][0]["env_backend"] and s,
        180,
        "the actor's env backend in status",
        [replay, learner, actor],
    )
    [a] = st["actors"]
    assert a["env_backend"] in ("sync", "envpool", "workers"), a
    assert a["env_backend_reason"].startswith(f"auto chose {a['env_backend']}: "), a
    assert "measured per batch step" in a["env_backend_reason"], a
    log = actor.output()
    assert f"env backend {a['env_backend_reason']}" in log, log[-2000:]
    text = rlfleet("status", "--learner", address)
    assert f"actor 0 env backend: auto chose {a['env_backend']}" in text.stdout, text.stdout
