"""The status a learner serves says a rate is not measured yet ("-"), rather than 0/s, until its first metrics row
measures one (learner/status.py `RunStatus`, deploy/launcher.py `progress_line`, deploy/status.py)."""

import time

from rlfleet.deploy.launcher import progress_line
from rlfleet.deploy.status import format_status, to_json_ready
from rlfleet.learner.status import RunStatus

COUNT = dict(learner_steps=200, policy_version=4, consumed_env_steps=0, dropped_env_steps=0)


def _status(run: RunStatus, env_steps: int) -> dict:
    st = run.fields(COUNT, env_steps, [], time.monotonic(), {})
    st["replay"] = []
    return st


def test_rates_read_not_measured_until_the_first_metrics_row_then_its_rates():
    run = RunStatus("dqn", "CartPole-v1")
    st = _status(run, 5000)
    assert "(-/s)" in progress_line(st, 10_000), progress_line(st, 10_000)
    assert "(-/s)" in format_status(st)
    assert to_json_ready(st)["env_steps_per_second"] is None
    start = time.monotonic()
    run.measure_rates(st, dict(time=start - 5.0, env_steps=0, learner_steps=0), start)
    st = _status(run, 5000)
    assert "(1,000/s)" in progress_line(st, 10_000), progress_line(st, 10_000)
    assert to_json_ready(st)["env_steps_per_second"] == 1000.0
