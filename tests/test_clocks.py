"""Timeouts, rates and ages keep their meaning when the wall clock steps back or forward (NTP, a person, a
suspended VM): a real cluster runs while every process's `time.time()` jumps back an hour and then forward two."""

import json
import math
import signal
import subprocess
import sys
import time

import portpicker
import pytest
from helpers import ENV, ROOT, status_or_none

pytestmark = pytest.mark.slow

# Loaded by every Python process of the cluster (PYTHONPATH): time.time() steps by OFFSET seconds once the
# monotonic clock (one for all processes of the host) reaches AT, per entry "AT:OFFSET" of the file
# RLFLEET_TEST_CLOCK_FILE, which the test writes once the cluster runs.
SITECUSTOMIZE = """
import os, time
_real, _file, _steps, _read_at = time.time, os.environ["RLFLEET_TEST_CLOCK_FILE"], [], [0.0]
def _stepped():
    now = time.monotonic()
    if not _steps and now - _read_at[0] > 0.2:
        _read_at[0] = now
        try:
            with open(_file) as f:
                _steps.extend(tuple(map(float, s.split(":"))) for s in f.read().split(","))
        except (OSError, ValueError):
            pass
    return _real() + sum(offset for at, offset in _steps if now >= at)
time.time = _stepped
"""


def test_status_and_run_times_survive_wall_clock_steps(tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    port = portpicker.pick_unused_port()
    clock_file = tmp_path / "clock-steps"
    env = dict(ENV, PYTHONPATH=str(tmp_path / "site"), RLFLEET_TEST_CLOCK_FILE=str(clock_file))
    back = forward = None
    logdir = tmp_path / "run"
    log = open(tmp_path / "up.log", "wb")
    up = subprocess.Popen(
        [sys.executable, "-m", "rlfleet.deploy.cli", "up", "--algo", "ppo", "--env", "Pendulum-v1"]
        + ["--total-steps", "100000000", "--learner-port", str(port), "--logdir", str(logdir), "--report-interval", "1"]
        + ["--set", "eval_every_updates=1000", "--set", "eval_episodes=1"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    seen = []
    try:
        deadline = time.monotonic() + 400
        while up.poll() is None and time.monotonic() < deadline:
            st = status_or_none(f"127.0.0.1:{port}")  # this process's clock is not stepped
            if st and st["actors"]:
                seen.append((time.monotonic(), st))
                if back is None:  # the cluster trains: an hour back in 4 s, then two hours forward
                    back, forward = time.monotonic() + 4, time.monotonic() + 14
                    tmp = tmp_path / "clock-steps.tmp"
                    tmp.write_text(f"{back}:-3600,{forward}:7200")
                    tmp.rename(clock_file)
                elif sum(t >= forward for t, _ in seen) >= 6:  # enough answers after both steps: SIGINT to `up`
                    break
            time.sleep(0.5)
        up.send_signal(signal.SIGINT)
        assert up.wait(timeout=180) == 130, (tmp_path / "up.log").read_text()[-3000:]
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
        log.close()
    assert back is not None, "no status listed an actor"
    phases = [sum(1 for t, _ in seen if lo <= t < hi) for lo, hi in ((0, back), (back, forward), (forward, 1e12))]
    assert all(n >= 2 for n in phases), f"status answered {phases} times before, between and after the steps"
    for _, st in seen:
        assert all(0 <= a["seconds_since_heartbeat"] < 10 for a in st["actors"]), st["actors"]
        assert 0 < st["uptime_seconds"] < 1000, st["uptime_seconds"]
        rate = st["env_steps_per_second"]  # NaN until the learner measured one
        assert math.isnan(rate) or 0 <= rate < 1e6, rate
    summary = json.loads((logdir / "summary.json").read_text())
    assert 0 < summary["wall_seconds"] < 1000, summary["wall_seconds"]
    rows = [json.loads(line) for line in (logdir / "metrics.jsonl").read_text().splitlines()]
    seconds = [r["wall_seconds"] for r in rows]
    assert seconds == sorted(seconds) and seconds[-1] < 1000, seconds
    assert all(0 <= r["env_steps_per_second"] < 1e6 for r in rows if r.get("env_steps_per_second") is not None)
