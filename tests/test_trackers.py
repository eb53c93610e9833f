"""Experiment trackers (`--track mlflow|wandb`, offline): a real run's metrics rows reach an MLflow file store and
an offline W&B run at step = env steps, with the run's settings as parameters; a resumed run continues them; a
tracker that fails is dropped and loses no row; one that is not installed is refused before anything starts."""

import glob
import json
import math

import pytest
from helpers import rlfleet

from rlfleet.learner import trackers
from rlfleet.learner.run_dir import MetricsLog


def _rows(run) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def _mlflow(run):
    import pathlib

    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=pathlib.Path(run, "mlruns").as_uri())


def _wandb_history_and_config(run) -> tuple[list[dict], dict]:
    """The history rows ({key: value}) and the config ({key: value}) of the offline W&B runs in RUN/wandb, in
    the order they were written (a resumed run writes a second offline run with the same id)."""
    from wandb.proto import wandb_internal_pb2
    from wandb.sdk.internal import datastore

    history, config = [], {}
    for path in sorted(glob.glob(str(run / "wandb" / "offline-run-*" / "run-*.wandb"))):
        store = datastore.DataStore()
        store.open_for_scan(path)
        while (data := store.scan_data()) is not None:
            record = wandb_internal_pb2.Record()
            record.ParseFromString(data)
            kind = record.WhichOneof("record_type")
            if kind == "history":
                history.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
            elif kind == "run":
                config.update(
                    {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.run.config.update}
                )
    return history, config


@pytest.mark.slow
def test_a_run_is_tracked_in_mlflow_and_wandb_offline_and_its_resume_continues(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 reads its file store only when allowed
    pytest.importorskip("mlflow")
    pytest.importorskip("wandb")
    run = tmp_path / "tracked run"
    args = ["--algo", "dqn", "--env", "CartPole-v1", "--logdir", run, "--report-interval", "1", "--seed", "3"]
    out = rlfleet("up", *args, "--total-steps", 6000, "--track", "mlflow", "--track", "wandb", timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    ids = json.loads((run / trackers.STATE_FILE).read_text())
    assert set(ids) == {"mlflow", "wandb"}
    rows = _rows(run)
    assert len(rows) >= 2, rows
    settings = json.loads((run / "settings.json").read_text())

    client = _mlflow(run)
    mlrun = client.get_run(ids["mlflow"])
    assert mlrun.info.status == "FINISHED" and mlrun.info.run_name == "tracked run"
    assert mlrun.data.params["learning_rate"] == str(settings["config"]["learning_rate"])
    assert mlrun.data.params["env_id"] == "CartPole-v1" and mlrun.data.params["seed"] == "3"
    steps = [(m.step, m.value) for m in client.get_metric_history(ids["mlflow"], "learner_steps")]
    assert sorted(steps) == sorted((r["env_steps"], float(r["learner_steps"])) for r in rows), (steps, rows)
    evals = {m.step: m.value for m in client.get_metric_history(ids["mlflow"], "eval_return_mean")}
    assert evals and evals == {
        r["env_steps"]: r["eval_return_mean"] for r in rows if r.get("eval_return_mean") is not None
    }

    history, config = _wandb_history_and_config(run)
    pairs = lambda some: [(r["env_steps"], r["learner_steps"]) for r in some]  # noqa: E731
    assert pairs(history) == pairs(rows)
    assert config["learning_rate"] == settings["config"]["learning_rate"] and config["algo"] == "dqn"

    # Resumed without --track: the run directory's trackers continue, the MLflow run the same one.
    out = rlfleet("up", "--resume", run, "--total-steps", 9000, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert json.loads((run / trackers.STATE_FILE).read_text())["mlflow"] == ids["mlflow"]
    more = _rows(run)[len(rows) :]
    assert more and more[-1]["env_steps"] >= 9000
    steps = {m.step for m in client.get_metric_history(ids["mlflow"], "learner_steps")}
    assert {r["env_steps"] for r in more} <= steps
    assert client.get_run(ids["mlflow"]).info.status == "FINISHED"
    history, _ = _wandb_history_and_config(run)
    assert pairs(history) == pairs(rows + more)  # every row, those that share an env-step count included


class _Failing:
    run_id = "x"

    def __init__(self):
        self.closed = None

    def log(self, step, scalars):
        raise ConnectionError("the tracking server went away")

    def close(self, completed):
        self.closed = completed


class _Kept:
    run_id = "y"

    def __init__(self):
        self.logged, self.closed = [], None

    def log(self, step, scalars):
        self.logged.append((step, scalars))

    def close(self, completed):
        self.closed = completed


def test_a_failing_tracker_is_dropped_and_no_row_is_lost(tmp_path, caplog):
    failing, kept = _Failing(), _Kept()
    metrics = MetricsLog(str(tmp_path), {"mlflow": failing, "wandb": kept})
    for n in (100, 200):
        metrics.write({"time": 1.0, "env_steps": n, "phase": "training", "learner_steps": n // 4, "x": math.nan})
    metrics.end_tracking(True)
    metrics.close()
    assert [json.loads(x)["env_steps"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [100, 200]
    assert kept.logged == [(n, {"env_steps": float(n), "learner_steps": n / 4}) for n in (100, 200)]
    assert kept.closed is True and failing.closed is False  # dropped at its first failure, its run ended stopped
    assert "--track mlflow: stopped tracking this run (ConnectionError: the tracking server went away)" in caplog.text


def test_a_tracker_that_is_not_installed_is_refused_before_anything_starts(tmp_path, monkeypatch):
    real = trackers.importlib.util.find_spec
    monkeypatch.setattr(trackers.importlib.util, "find_spec", lambda name: None if name == "wandb" else real(name))
    with pytest.raises(
        trackers.TrackerError, match=r'--track wandb needs the wandb package: pip install -e "\.\[wandb\]"'
    ):
        trackers.check_trackers(["mlflow", "wandb"])
    out = rlfleet("up", "--algo", "dqn", "--env", "CartPole-v1", "--track", "neptune", "--logdir", tmp_path / "r")
    assert out.returncode == 2 and "'neptune' is not one of 'mlflow', 'wandb'" in out.stderr, out.stderr
    assert not (tmp_path / "r").exists()


def test_a_recorded_tracker_that_cannot_start_keeps_its_run_for_the_next_resume(tmp_path, monkeypatch):
    (tmp_path / trackers.STATE_FILE).write_text(json.dumps({"mlflow": "abc", "wandb": "def"}))

    def unreachable(*args):
        raise ConnectionError("the tracking server is down")

    monkeypatch.setitem(trackers._MAKERS, "mlflow", unreachable)
    monkeypatch.setitem(trackers._MAKERS, "wandb", lambda logdir, name, params, run_id: _Kept())
    opened = trackers.open_trackers([], str(tmp_path), "run", {})
    assert list(opened) == ["wandb"]
    assert json.loads((tmp_path / trackers.STATE_FILE).read_text()) == {"mlflow": "abc", "wandb": "y"}
