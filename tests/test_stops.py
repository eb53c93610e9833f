"""Stops: prompt, clean, and complete (real `rlfleet up` and service processes on loopback).

- `up` killed with SIGKILL leaves no process behind: its children get the parent-death signal, checkpoint and
  exit (they run in sessions of their own, so nothing else would reach them).
- SIGTERM during an evaluation (here the final one, made long on purpose) stops the learner within seconds,
  with a checkpoint written.
- An actor stopped with SIGTERM leaves the learner's status at once (its last heartbeat says so).
- A replay server started without --checkpoint-dir leaves no temporary folder behind (killed with SIGKILL, it
  cannot: the next replay server started removes that folder).
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest
from helpers import ENV, ROOT, start_replay_and_learner, status_or_none, wait_for

from rlfleet.deploy.status import get_status

DQN = ("--algo", "dqn", "--env", "CartPole-v1", "--set", "min_replay_size=300")


def _up(tmp_path, port, *args):
    log = open(tmp_path / "up.log", "wb")
    return subprocess.Popen(
        [sys.executable, "-m", "rlfleet.deploy.cli", "up", "--learner-port", str(port), *map(str, args)],
        cwd=ROOT,
        env=ENV,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _kill_tree(procs):
    """SIGKILL to each of `procs` (Popen or psutil.Process) still running: nothing a test starts outlives it."""
    for p in procs:
        try:
            p.kill()
        except (psutil.NoSuchProcess, ProcessLookupError):
            pass


@pytest.mark.slow
def test_sigkill_of_up_leaves_no_process_behind(tmp_path, free_port):
    port = free_port()
    run = tmp_path / "run"
    up = _up(tmp_path, port, *DQN, "--actors", 2, "--total-steps", 10**7, "--logdir", run)
    tree = []
    try:
        wait_for(lambda: (s := status_or_none(f"127.0.0.1:{port}")) and s["learner_steps"] > 0, 180, "training")
        tree = psutil.Process(up.pid).children(recursive=True)
        assert len(tree) >= 4, tree  # replay, learner, 2 actors
        up.kill()
        up.wait()
        gone, alive = psutil.wait_procs(tree, timeout=30)
        assert not alive, [(p.pid, p.cmdline()) for p in alive]
    finally:
        _kill_tree([up, *tree])
    # The learner was stopped by a signal it handles: it checkpointed on the way out.
    assert list((run / "checkpoints").glob("ckpt-*.index")), (tmp_path / "up.log").read_text()[-3000:]


@pytest.mark.slow
def test_sigterm_during_an_evaluation_stops_within_seconds(tmp_path, free_port):
    port = free_port()
    run = tmp_path / "run"
    # A final evaluation of 100,000 episodes: far longer than the test (one episode takes milliseconds).
    up = _up(
        tmp_path,
        port,
        "--algo",
        "ppo",
        "--env",
        "InvertedPendulum-v5",
        "--envs-per-actor",
        4,
        "--set",
        "eval_episodes=100000",
        "--set",
        "eval_every_updates=100000",
        "--total-steps",
        3000,
        "--logdir",
        run,
    )
    tree = []
    try:
        wait_for(
            lambda: (s := status_or_none(f"127.0.0.1:{port}")) and s["phase"] == "evaluating", 240, "the final eval"
        )
        time.sleep(2)
        tree = psutil.Process(up.pid).children(recursive=True)
        t = time.monotonic()
        up.send_signal(signal.SIGTERM)
        assert up.wait(60) == 130
        stopped_s = time.monotonic() - t
    finally:
        _kill_tree([up, *tree])
        up.wait()
    out = (tmp_path / "up.log").read_text()
    assert stopped_s < 15, (stopped_s, out[-3000:])
    assert list((run / "checkpoints").glob("ckpt-*.index")), out[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    # Not completed: the final evaluation did not finish (--resume runs it).
    assert summary["completed"] is False and summary["final_eval_return_mean"] is None, summary
    assert summary["env_steps"] >= 3000, summary


@pytest.mark.slow
def test_an_actor_stopped_with_sigterm_leaves_status_at_once(procs, tmp_path, free_port):
    replay, learner, address = start_replay_and_learner(procs, free_port, DQN, tmp_path / "run")
    wait_for(lambda: status_or_none(address), 120, "the learner", [replay, learner])
    actors = [procs.start(f"actor-{i}", "actor", "--learner", address) for i in range(2)]
    st = wait_for(
        lambda: (
            (s := status_or_none(address)) and len(s["actors"]) == 2 and all(a["env_steps"] for a in s["actors"]) and s
        ),
        120,
        "two actors stepping",
        [learner, *actors],
    )
    # Stopped before the run's end: non-zero, so that a supervisor (a Kubernetes Job) starts an actor again.
    assert actors[0].stop() == 3 and "stopped before the run's end: exit 3" in actors[0].output()
    st = get_status(address, 5)
    assert len(st["actors"]) == 1, st["actors"]  # not after the heartbeat timeout: at once
    steps = int(actors[0].output().rsplit("stopped after ", 1)[1].split()[0])
    assert steps > 0 and st["env_steps"] >= steps


@pytest.mark.slow
def test_replay_without_checkpoint_dir_leaves_no_temporary_folder(procs, free_port, tmp_path):
    """Stopped with SIGTERM, the server removes its scratch folder; killed with SIGKILL it cannot, and the next
    server started on the machine removes it (empty, and its pid gone), keeping a live server's folder."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = dict(ENV, TMPDIR=str(scratch))

    def start(name):
        with open(tmp_path / f"{name}.log", "wb") as log:
            p = subprocess.Popen(
                [sys.executable, "-m", "rlfleet.deploy.cli", "replay", *DQN, "--port", str(free_port())],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_for(lambda: "serving on port" in (tmp_path / f"{name}.log").read_text(), 120, f"replay server {name}")
        return p

    started = []
    try:
        started.append(killed := start("killed"))
        left = os.listdir(scratch)
        killed.kill()
        killed.wait()
        assert len(left) == 1 and os.listdir(scratch) == left, "SIGKILL should leave the folder (nothing can run)"
        started.append(first := start("first"))
        started.append(second := start("second"))
        during = set(os.listdir(scratch))
        assert left[0] not in during and len(during) == 2, (left, during)  # swept; both live folders kept
        for p in (second, first):
            p.send_signal(signal.SIGTERM)
            assert p.wait(60) == 0
    finally:
        for p in started:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert os.listdir(scratch) == [], os.listdir(scratch)


def _signal_burst(proc, seconds=2.0, gap_s=0.0002):
    """SIGTERMs `gap_s` apart for `seconds` or until `proc` exits (a parent's SIGTERM and its death signal
    together, Ctrl-C pressed again and again): many come while the process is handling an earlier one."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            os.kill(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        time.sleep(gap_s)


@pytest.mark.slow
def test_a_burst_of_sigterms_stops_every_service_cleanly(procs, tmp_path, free_port):
    """Each service starts its clean stop once however many signals come: before, a signal handler that set a
    threading.Event could wait forever for the event's lock, held by its own thread (a replay server hung so,
    its final checkpoint never written)."""
    replay_port, learner_port = free_port(), free_port()
    replay_dir, logdir = tmp_path / "replay", tmp_path / "run"
    replay = procs.start("replay", "replay", *DQN, "--port", replay_port, "--checkpoint-dir", replay_dir)
    address = f"127.0.0.1:{learner_port}"
    learner = procs.start(
        "learner", "learner", *DQN, "--replay", f"127.0.0.1:{replay_port}", "--logdir", logdir,
        "--port", learner_port, "--total-steps", 10**7,
    )  # fmt: skip
    wait_for(lambda: status_or_none(address), 120, "the learner", [replay, learner])
    actor = procs.start("actor", "actor", "--learner", address)
    wait_for(
        lambda: (s := status_or_none(address)) and s["learner_steps"] > 0, 180, "training", [replay, learner, actor]
    )
    for p, done in (
        (actor, "stopped after"),
        (learner, " INFO stopped; checkpoint "),
        (replay, " INFO stopped\n"),
    ):
        _signal_burst(p.proc)
        try:
            p.proc.wait(90)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"hung after a burst of SIGTERMs:\n{p.output()[-3000:]}") from None
        # Signals that come after the stop, while the interpreter exits, may end it with -SIGTERM: no harm then.
        assert done in p.output() and p.proc.returncode in (0, -signal.SIGTERM), (p.proc.returncode, p.output())
    assert list((logdir / "checkpoints").glob("ckpt-*.index")), learner.output()[-3000:]
    assert " INFO checkpoint " in replay.output(), replay.output()[-3000:]


def test_the_stop_signal_handler_never_waits_for_the_stop_events_lock():
    """The handler returns at once even while its own thread holds the stop event's lock (as the main thread does
    inside `Event.wait` or an earlier handler's `Event.set`); the event is set once that lock is let go, and a
    second signal starts nothing more."""
    import threading

    from rlfleet.common.stopping import on_stop_signals

    stop, calls = threading.Event(), []
    previous = signal.getsignal(signal.SIGUSR1)
    try:
        assert on_stop_signals(lambda: calls.append(1), stop.set, signals=(signal.SIGUSR1,))
        handler = signal.getsignal(signal.SIGUSR1)
        with stop._cond:  # the event's lock, held by this (the main) thread
            handler(signal.SIGUSR1, None)  # `lambda *_: stop.set()` waited here for good
            handler(signal.SIGUSR1, None)
            assert not stop.is_set()
        assert stop.wait(10) and calls == [1]
        outcome = []
        worker = threading.Thread(target=lambda: outcome.append(on_stop_signals(stop.set, signals=(signal.SIGUSR1,))))
        worker.start()
        worker.join()
        assert outcome == [False] and signal.getsignal(signal.SIGUSR1) is handler  # off the main thread: nothing
    finally:
        signal.signal(signal.SIGUSR1, previous)


@pytest.mark.slow
def test_replay_on_port_0_serves_on_the_free_port_it_prints_and_stops(procs, tmp_path):
    """`--port 0` serves on a free port and prints that one (Reverb, given 0, reported 0: the final checkpoint's
    client dialled localhost:0 and the server hung at its stop)."""
    import reverb

    replay = procs.start("replay", "replay", *DQN, "--port", 0, "--checkpoint-dir", tmp_path / "replay")
    line = wait_for(
        lambda: next((ln for ln in replay.output().splitlines() if "serving on port" in ln), None),
        120,
        "the replay server",
        [replay],
    )
    port = int(re.search(r"serving on port (\d+)", line).group(1))
    assert port > 0, line
    assert reverb.Client(f"127.0.0.1:{port}").server_info(timeout=10)
    assert replay.stop(timeout=60) == 0 and " INFO stopped\n" in replay.output(), replay.output()[-3000:]
