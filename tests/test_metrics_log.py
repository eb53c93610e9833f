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
