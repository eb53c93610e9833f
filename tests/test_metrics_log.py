"""The learner's metrics log: every row in metrics.jsonl and, its numbers, in TensorBoard at the row's env steps."""

import json
import math

from helpers import rows_as_scalars, tensorboard_scalars

from rlfleet.learner.run_dir import MetricsLog


def test_rows_of_many_shapes_reach_tensorboard_as_they_reach_the_jsonl(tmp_path):
    log = MetricsLog(str(tmp_path))
    # A name a graph's name scope refuses (it starts with "_"): its set is written eagerly.
    rows = [dict(env_steps=7, _odd_name=1.5)]
    log.write(rows[0])
    # More sets of field names than MetricsLog traces a writer for: the later ones are written eagerly.
    for i in range(MetricsLog.TRACED_FIELD_SETS + 4):
        for version in range(3):  # each set of names more than once: the traced writer is reused
            row = dict(env_steps=1000 * i + version, time=12.5, policy_version=version, approx_kl=0.01 * (i + 1))
            row[f"field_{i}"] = i + 0.25
            row["done"] = version == 2
            row["eval_return_mean"] = math.nan if version == 1 else -3.5
            rows.append(row)
            log.write(row)
    log.write(dict(env_steps=5, time=1.0))  # a row with no numbers to plot
    # One traced writer per set of names, up to the limit; the set that failed to trace holds none.
    traced = [fn for fn in log._traced.values() if fn is not None]
    assert len(log._traced) == MetricsLog.TRACED_FIELD_SETS and len(traced) == MetricsLog.TRACED_FIELD_SETS - 1
    assert log._traced[("_odd_name",)] is None
    log.close()

    read = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(read) == len(rows) + 1 and read[2]["eval_return_mean"] is None  # NaN written as null
    assert tensorboard_scalars(tmp_path / "tb") == rows_as_scalars(rows)


def test_a_row_a_crash_cut_short_costs_that_row_alone(tmp_path):
    """A crash while a row is written leaves a torn last line: the resumed run's log starts on a new line, and the
    run's reader (`rlfleet report`, the seeds' report) keeps every row before and after the torn one."""
    from rlfleet.analysis.runs_report import load_run
    from rlfleet.common.files import read_json_lines

    (tmp_path / "run.json").write_text(json.dumps(dict(algo="ppo", env_id="Pendulum-v1")))
    log = MetricsLog(str(tmp_path))
    log.write(dict(env_steps=1, eval_return_mean=-1.0))
    log.close()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"env_steps": 2, "eval_ret')  # the crash
    resumed = MetricsLog(str(tmp_path))
    for steps in (3, 4):
        resumed.write(dict(env_steps=steps, eval_return_mean=-float(steps)))
    resumed.close()
    assert [r["env_steps"] for r in load_run(str(tmp_path))["rows"]] == [1, 3, 4]
    rows, skipped = read_json_lines(str(tmp_path / "metrics.jsonl"))
    assert len(rows) == 3 and skipped == 1
    # A torn line anywhere (two half rows run together by a copy taken while the file grew) costs itself alone.
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    (tmp_path / "metrics.jsonl").write_text("\n".join([lines[0][:9] + lines[2], *lines[1:]]) + "\n")
    assert [r["env_steps"] for r in load_run(str(tmp_path))["rows"]] == [3, 4]
