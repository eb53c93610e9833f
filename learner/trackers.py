"""Experiment trackers that get the learner's metrics rows too, beside metrics.jsonl and TensorBoard (`--track`):

- `mlflow`: an MLflow run in the run directory's file store, RUN/mlruns (`mlflow ui --backend-store-uri
  RUN/mlruns`), or on the tracking server `$MLFLOW_TRACKING_URI` names when it is set.
- `wandb`: a Weights & Biases run written offline to RUN/wandb (`wandb sync RUN/wandb/offline-run-*` uploads
  it later); `$WANDB_MODE` chooses another mode.

Each is an optional extra (`pip install -e ".[mlflow]"`, `".[wandb]"`). A row's numeric fields are logged at
step = its env steps; the run's settings (algorithm, env, seed, budget, every config field) are the run's
parameters. RUN/trackers.json keeps each tracker's run id, so that a resumed run continues the same tracked run
and keeps tracking without the flag. A tracker that fails is dropped with a warning: training goes on, and
metrics.jsonl and TensorBoard keep every row.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import pathlib
import time
import uuid

from rlfleet.common.files import atomic_write
from rlfleet.common.logs import logger

log = logger("learner")

# --track NAME -> (the module it needs, the extra that installs it)
TRACKERS = {"mlflow": ("mlflow", "mlflow"), "wandb": ("wandb", "wandb")}
STATE_FILE = "trackers.json"  # RUN/trackers.json: {tracker: its run id}
EXPERIMENT = "rlfleet"  # the MLflow experiment and the W&B project the runs go to


class TrackerError(ValueError):
    """A tracker cannot be used: an unknown name or its package is not installed; the message says which to
    install."""


def check_trackers(names) -> tuple[str, ...]:
    """The tracker names, checked: each is known and its package installed.

    Raises:
        TrackerError: naming the tracker and the install command.
    """
    for name in names:
        if name not in TRACKERS:
            raise TrackerError(f"--track {name}: no such tracker; use one of {', '.join(TRACKERS)}.")
        module, extra = TRACKERS[name]
        if importlib.util.find_spec(module) is None:
            raise TrackerError(
                f'--track {name} needs the {module} package: pip install -e ".[{extra}]" in a checkout '
                f'(or pip install "rlfleet[{extra}]"), or leave out --track {name}.'
            )
    return tuple(dict.fromkeys(names))


class MlflowTracker:
    """An MLflow run; `log` sends a row's scalars as one batch of metrics at step `step`.

    Args:
        logdir: the run directory (its mlruns/ is the file store unless $MLFLOW_TRACKING_URI is set).
        name: the run's name; params: {parameter: value}, logged when the run is made.
        run_id: an MLflow run to continue (a resumed run), or None for a new one.
    """

    def __init__(self, logdir: str, name: str, params: dict, run_id: str | None = None):
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            # The local file store is in maintenance mode in MLflow 3 and refused unless allowed: it is the one
            # store that needs no server or database, which a run directory is.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            uri = pathlib.Path(os.path.abspath(logdir), "mlruns").as_uri()  # percent-encoded: never parsed as a path
        self.client = MlflowClient(tracking_uri=uri)
        if run_id is not None:  # a resumed run: the tracked run ended with the earlier process
            self.client.update_run(run_id, status="RUNNING")
            self.run_id = run_id
            return
        experiment = self.client.get_experiment_by_name(EXPERIMENT)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(EXPERIMENT)
        self.run_id = self.client.create_run(experiment_id, run_name=name).info.run_id
        from mlflow.entities import Param

        items = [Param(k, str(v)[:6000]) for k, v in params.items()]
        try:
            for i in range(0, len(items), 100):  # MLflow takes at most 100 parameters a batch
                self.client.log_batch(self.run_id, params=items[i : i + 100])
        except Exception:
            self.close(False)  # not left RUNNING
            raise

    def log(self, step: int, scalars: dict) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in scalars.items()])

    def close(self, completed: bool) -> None:
        self.client.set_terminated(self.run_id, "FINISHED" if completed else "KILLED")


class WandbTracker:
    """A Weights & Biases run, offline by default; `log` sends every row, with its env steps as the x-axis of
    every metric (`define_metric`): rows that share an env-step count (a learner that trains while the actors
    wait) and the rows after a resume from an earlier checkpoint are all kept, which W&B's own step would merge
    or drop.

    Args: as `MlflowTracker`'s; the run's files go to RUN/wandb.
    """

    def __init__(self, logdir: str, name: str, params: dict, run_id: str | None = None):
        import wandb

        self.run_id = run_id or uuid.uuid4().hex[:16]
        mode = os.environ.get("WANDB_MODE") or "offline"
        self.run = wandb.init(
            mode=mode,
            dir=os.path.abspath(logdir),
            project=EXPERIMENT,
            name=name,
            id=self.run_id,
            resume=None if mode == "offline" else "allow",  # an offline run cannot be resumed; a new one is made
            config=params,
            settings=wandb.Settings(console="off", silent=True, x_disable_stats=True),
        )
        self.run.define_metric("*", step_metric="env_steps")

    def log(self, step: int, scalars: dict) -> None:
        self.run.log({**scalars, "env_steps": step})

    def close(self, completed: bool) -> None:
        self.run.finish(exit_code=0 if completed else 1)


_MAKERS = {"mlflow": MlflowTracker, "wandb": WandbTracker}


def open_trackers(names, logdir: str, name: str, params: dict) -> dict:
    """The trackers `names` plus those the run directory `logdir` recorded (a resumed run keeps tracking),
    each continuing its recorded run; records their run ids in RUN/trackers.json. A tracker that cannot start
    is left out with a warning.

    Returns:
        {tracker name: tracker}.
    """
    recorded = read_recorded(logdir)
    opened = {}
    for tracker in dict.fromkeys([*recorded, *names]):
        try:
            check_trackers([tracker])
            opened[tracker] = _MAKERS[tracker](logdir, name, params, recorded.get(tracker))
        except Exception as e:  # TrackerError, and whatever the tracker's package raised
            log.warning("--track %s: not tracking this run (%s: %s)", tracker, type(e).__name__, e)
    if opened:
        # A recorded tracker that could not start this time keeps its run id for the next resume.
        ids = {**recorded, **{k: t.run_id for k, t in opened.items()}}
        try:
            atomic_write(os.path.join(logdir, STATE_FILE), json.dumps(ids))
        except OSError as e:  # a resume would start new tracked runs; this one is tracked all the same
            log.warning("could not record the tracked runs in %s (%s)", STATE_FILE, e)
    return opened


def read_recorded(logdir: str) -> dict:
    """{tracker: run id} from RUN/trackers.json; {} when there is none or it cannot be read."""
    try:
        with open(os.path.join(logdir, STATE_FILE)) as f:
            recorded = json.load(f)
    except (OSError, ValueError):
        return {}
    if not isinstance(recorded, dict):
        return {}
    return {k: v for k, v in recorded.items() if k in TRACKERS and isinstance(v, str) and v}


def scalars_of(row: dict) -> dict:
    """The fields of a metrics row a tracker gets: the finite numbers, without "time" (a wall-clock stamp)."""
    return {
        k: float(v)
        for k, v in row.items()
        if k != "time" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }
