"""The learner process: the training loop of one algorithm, its checkpoints and status.

The learner is split by job: the algorithm's update rule is its `Agent` (`rlfleet.algorithms.base`, made
by the registry: `rlfleet.algorithms`), the actors' book is an `ActorRegistry`
(`rlfleet.learner.actor_registry`), the run directory's files are written by `rlfleet.learner.run_dir`,
and the gRPC face is `rlfleet.learner.servicer`. This module holds the training loop and what ties them.

Threads:
- main: reads batches from the replay queue, updates, publishes weights,
  evaluates, checkpoints and writes metrics; stops at `total_steps` env steps.
- sampler: pulls items out of Reverb into a small local queue; reconnects when
  the replay server restarts.
- housekeeping: once a second, reads the replay tables' counters for status and removes actors whose
  heartbeats stopped from the actor registry.
- gRPC workers: RegisterActor, StreamWeights, Heartbeat, GetStatus, health.
All state shared with the gRPC threads is guarded by `Learner.lock`.
"""

from __future__ import annotations

import collections
import dataclasses
import gc
import json
import logging
import math
import numbers
import os
import queue
import shlex
import sys
import threading
import time

import numpy as np
import reverb
import tensorflow as tf

from rlfleet import algorithms
from rlfleet.actors.envs import env_spec, require_action_kind
from rlfleet.algorithms.base import Agent, StepResult
from rlfleet.algorithms.settings import make_algo_config
from rlfleet.deploy.addresses import bind_problem, host_port
from rlfleet.deploy.files import StorageError, check_writable
from rlfleet.deploy.stopping import on_stop_signals
from rlfleet.learner import evaluation
from rlfleet.learner.actor_registry import ActorRegistry
from rlfleet.learner.checkpoints import CheckpointError, CheckpointStore, quarantine, restore_newest
from rlfleet.learner.run_dir import (
    ACTOR_IDS_FILE,
    MetricsLog,
    check_run_dir,
    read_next_actor_id,
    read_progress,
    run_identity,
    write_json,
)
from rlfleet.learner.servicer import BindError, LearnerServer, WeightsBroadcast
from rlfleet.proto import arrays as proto_arrays
from rlfleet.proto import rlfleet_pb2, security
from rlfleet.replay.checkpoints import REPLAY_SUBDIR, ReplayCheckpointError, checkpoint_replay
from rlfleet.replay.server import table_status

log = logging.getLogger("rlfleet.learner")

ACTOR_TIMEOUT_S = 30.0  # default: an actor without heartbeat for this long leaves the status list
REPLAY_OUTAGE_S = 300.0  # how long the learner waits for a lost replay server to come back
RECENT_EPISODES = 100  # episode_return_mean is over this many recent training episodes


class LearnerError(RuntimeError):
    """A learner setup problem with a message that says how to fix it."""


class NonFiniteError(LearnerError):
    """Training produced a NaN/inf loss or weights: nothing of it was published or checkpointed."""


def non_finite(values: dict) -> list[str]:
    """Names of the entries of `values` ({name: number or numpy array}) holding a NaN or inf (floats only)."""
    bad = []
    for name, v in values.items():
        a = np.asarray(v)
        if a.dtype.kind in "fc" and not np.isfinite(a).all():
            bad.append(name)
    return bad


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """Everything one learner process is told: what it trains, where its data is, and how it serves.

    Attributes:
        algo: a registered algorithm (`rlfleet.algorithms`: ppo, dqn, qdagger, or a plugin's).
        env_id: gymnasium id.
        replay_address: host:port of the Reverb server holding the algorithm's table.
        logdir: run directory (checkpoints/, tb/, metrics.jsonl, summary.json).
        total_steps: stop after this many env steps (0: run until stopped).
        preset / overrides: hyperparameters (`rlfleet.algorithms.settings.make_algo_config`).
        seed: the run's seed (actors' env seeds and the networks' initialisation follow from it).
        resume: a run directory whose latest checkpoint to continue from.
        teacher / teacher_replay: algorithms with a teacher (QDagger): the teacher's run directory and the
            Reverb server holding its restored replay (`rlfleet replay --teacher`).
        replay_for_actors: the replay address as actors should dial it (None: `replay_address`).
        env_backend: the actors' env backend (`rlfleet.actors.envs.BACKENDS`, or "auto").
        port / bind: where the gRPC service listens (port 0: a free one).
        tls: (cert PEM path, key PEM path, client CA PEM path or None) to serve TLS; None: plaintext.
        token: shared token every `rlfleet.Learner` call must carry ("" = none; `rlfleet.proto.security`).
        report_interval_s: seconds between metrics rows; checkpoint_interval_s: seconds between checkpoints.
        linger_s: seconds the finished learner keeps answering status before it exits.
        actor_timeout_s: seconds without a heartbeat after which an actor leaves the status list (its env
            steps stay counted; a heartbeat later re-admits it).
    """

    algo: str
    env_id: str
    replay_address: str
    logdir: str
    total_steps: int = 0
    preset: str = "default"
    overrides: dict = dataclasses.field(default_factory=dict)
    seed: int = 0
    resume: str | None = None
    teacher: str | None = None
    teacher_replay: str | None = None
    replay_for_actors: str | None = None
    env_backend: str = "auto"
    port: int = 0
    bind: str = "127.0.0.1"
    tls: tuple | None = None
    token: str = ""
    report_interval_s: float = 5.0
    checkpoint_interval_s: float = 120.0
    linger_s: float = 0.0
    actor_timeout_s: float = ACTOR_TIMEOUT_S


class Learner:
    """Learner service for one registered algorithm (`rlfleet.algorithms`), built from a `RunSpec`.

    Raises:
        EnvError / ValueError / LearnerError / RunDirError: bad env, preset, replay table or run directory.
        TeacherError (a ValueError): the teacher is not a usable teacher for the env.
        rlfleet.deploy.files.StorageError: the run directory cannot be written.
    """

    def __init__(self, run: RunSpec):
        self.run_spec = run
        self.algo, self.env_id, self.seed, self.preset = run.algo, run.env_id, run.seed, run.preset
        self.replay_address = run.replay_address
        self.replay_for_actors = run.replay_for_actors or run.replay_address
        self.logdir, self.total_steps = run.logdir, run.total_steps
        self.env_backend = run.env_backend
        self.report_interval_s, self.checkpoint_interval_s = run.report_interval_s, run.checkpoint_interval_s
        self.linger_s, self.actor_timeout_s = run.linger_s, run.actor_timeout_s
        self.teacher_replay = run.teacher_replay
        identity = self._setup_algorithm(run)
        progress = self._setup_checkpoints(run)
        write_json(os.path.join(self.logdir, "run.json"), identity)
        self._setup_state(run, progress)
        self._bind(run)

    def _setup_algorithm(self, run: RunSpec) -> dict:
        """The env, settings and agent of the run, checked against the run directory; returns run.json's
        identity."""
        self.spec = env_spec(run.env_id)
        require_action_kind(self.spec, run.algo)
        self.config = make_algo_config(run.algo, run.preset, run.env_id, run.overrides)
        check_writable(run.logdir, "the run directory")  # StorageError: read-only, no permission, full
        self.algorithm = algorithms.get(run.algo)
        if self.algorithm.uses_teacher and not (run.teacher and run.teacher_replay):
            raise LearnerError(
                f"--algo {run.algo} needs --teacher DIR (the run directory it learns from) and "
                "--teacher-replay HOST:PORT (`rlfleet replay --teacher DIR`)."
            )
        teacher = run.teacher if self.algorithm.uses_teacher else None
        identity = run_identity(run.algo, run.env_id, run.preset, self.config.to_json(), teacher)
        check_run_dir(run.logdir, run.resume, identity)
        self.agent = make_agent(
            run.algo, self.spec, self.config, run.seed, teacher, run.teacher_replay, run.total_steps
        )
        extras = {k: v for k, v in self.agent.status_extras().items() if k != "phase"}
        if not all(isinstance(v, numbers.Real) for v in extras.values()):
            raise LearnerError(
                f"algorithm {run.algo}: status_extras() must give numbers (besides 'phase'), not {extras}."
            )
        try:
            self.network_spec = rlfleet_pb2.NetworkSpec(**self.agent.actor_network())
        except (ValueError, TypeError) as e:
            raise LearnerError(
                f"algorithm {run.algo}: its actor_network() does not fit the NetworkSpec message ({e}); use the "
                "fields of NetworkSpec in proto/rlfleet.proto."
            ) from None
        if getattr(self.config, "lr_schedule", "constant") == "linear" and not run.total_steps:
            print(
                "rlfleet learner: warning: lr_schedule = linear anneals over --total-steps, which is not set; "
                "the learning rate stays constant (pass --total-steps, or --set lr_schedule=constant).",
                file=sys.stderr,
                flush=True,
            )
        return identity

    def _setup_checkpoints(self, run: RunSpec) -> dict:
        """The counters, the checkpoint of agent and counters, and with `resume` their restore from the newest
        intact checkpoint; returns the restored progress record (`read_progress`)."""
        names = ("learner_steps", "env_steps", "policy_version", "consumed_env_steps", "dropped_env_steps", "updates")
        self.counters = {k: tf.Variable(0, dtype=tf.int64) for k in names}
        # The training loop and status use `count` (Python ints: every eager TensorFlow op costs memory, see
        # rlfleet.algorithms.ppo.learning.BatchPPO._update); the variables hold them for checkpoints (`_save`).
        self.count = {k: 0 for k in self.counters}
        # Checkpoints name the policy version's variable "weights_version", the status contract's name for it.
        saved = {("weights_version" if k == "policy_version" else k): v for k, v in self.counters.items()}
        self.ckpt = tf.train.Checkpoint(**self.agent.checkpoint_items(), **saved)
        self.checkpoints = CheckpointStore(os.path.join(run.logdir, "checkpoints"), self.ckpt, keep=3)
        if not run.resume:
            return read_progress(None)
        resume = run.resume
        try:
            latest, skipped = restore_newest(os.path.join(resume, "checkpoints"), self.ckpt)
        except CheckpointError as e:
            raise LearnerError(
                f"--resume {resume}: {e}. Resume from an intact run directory, or start a new run."
            ) from None
        for line in skipped:
            print(f"rlfleet learner: warning: skipped the damaged checkpoint {line}", flush=True)
        if skipped and os.path.abspath(resume) == os.path.abspath(run.logdir):  # its own: moved aside
            moved = quarantine(os.path.join(resume, "checkpoints"), skipped)
            if moved:
                print(f"rlfleet learner: moved the damaged checkpoint files aside: {', '.join(moved)}", flush=True)
        self.agent.sync_from_checkpoint()
        self.count = {k: int(v.numpy()) for k, v in self.counters.items()}
        self.agent.on_resume(self.count["env_steps"])
        print(f"rlfleet learner: resumed from {latest}", flush=True)
        if run.total_steps and self.count["env_steps"] >= run.total_steps:
            print(
                f"rlfleet learner: this run already has {self.count['env_steps']:,} of its {run.total_steps:,} env "
                "steps: it evaluates and finishes again. To train on, raise --total-steps (docker-compose: "
                "RLFLEET_TOTAL_STEPS); for a new run, give another run directory (RLFLEET_RUN).",
                flush=True,
            )
        return read_progress(latest)

    def _setup_state(self, run: RunSpec, progress: dict) -> None:
        """The service's state: locks, phase, the actors' book, recent returns, the weights broadcast."""
        self.lock = threading.Lock()
        self._actor_ids_lock = threading.Lock()  # RUN/actor_ids.json
        self.stop_event = threading.Event()  # SIGTERM/SIGINT or end of run
        self.run_over = False  # actors are told to stop
        self.finished = False  # the run is over for good and summary.json written (Status.finished)
        self.phase = "waiting_for_actors"
        self.fault = ""  # why the learner stopped with an error (status `fault`)
        self.start_time = time.monotonic()
        self.registry = ActorRegistry(
            run.actor_timeout_s,
            base_env_steps=self.count["env_steps"],  # restored
            next_actor_id=progress["next_actor_id"],
            away=progress["actor_env_steps"],  # after --resume: the actors of the checkpoint, counted to there
            # Without a progress record nothing tells which actors the checkpoint's count holds.
            restored=bool(run.resume) and progress["recorded"],
        )
        if run.resume:
            # Ids the earlier process gave out after its last checkpoint are not given out again: their actors
            # rejoin with them (ActorRegistry.heartbeat) and a newcomer must not share one.
            self.registry.next_actor_id = max(self.registry.next_actor_id, read_next_actor_id(run.resume))
        # Seconds this run trained in earlier processes (up to the restored checkpoint).
        self.earlier_wall_s = progress["wall_seconds"]
        self.recent_returns = collections.deque(maxlen=RECENT_EPISODES)
        self.eval_return_mean = math.nan
        self.last_metrics: dict = {}
        self.eval_env_steps: int | None = None
        self.rates = {"env_steps_per_second": 0.0, "learner_steps_per_second": 0.0}
        self.weights = WeightsBroadcast()
        self._sample_queue: queue.Queue = queue.Queue(maxsize=self.agent.prefetch)
        self._sampler_error: Exception | None = None
        self._replay_status: list[dict] = []

    def _bind(self, run: RunSpec) -> None:
        """The gRPC service on `run.bind`:`run.port` (not started yet)."""
        # Weight streams and unary calls share no thread pool (asyncio server); no SO_REUSEPORT, so a second
        # learner on a port that one already holds fails here instead of splitting the actors between the two.
        problem = bind_problem(run.bind, run.port)
        if problem is None:
            try:
                self.server = LearnerServer(
                    self,
                    host_port(run.bind, run.port),
                    proto_arrays.GRPC_OPTIONS,
                    security.server_credentials(*run.tls) if run.tls else None,
                    run.token,
                )
            except BindError:
                problem = bind_problem(run.bind, run.port) or "gRPC refused the address"
        if problem is not None:
            raise LearnerError(
                f"cannot bind the learner service to {host_port(run.bind, run.port)}: {problem}; choose another "
                "--bind address or --port (--learner-port for `rlfleet up`)."
            )
        self.port = self.server.port
        self.address = host_port(run.bind, self.port)

    # ----- called by the servicer (gRPC worker threads) -----

    def admit_actor(self, host: str, address: str) -> int:
        """Registers a new actor; returns its id."""
        with self.lock:
            actor_id = self.registry.register(host, address, self.config.envs_per_actor, time.monotonic())
        # Written (and synced) outside the learner's lock, which heartbeats and status wait on; the count only
        # grows and is read under the file's own lock, so the file never goes back.
        with self._actor_ids_lock:
            write_json(os.path.join(self.logdir, ACTOR_IDS_FILE), dict(next_actor_id=self.registry.next_actor_id))
        log.info("actor %d registered from %s", actor_id, host)
        return actor_id

    def run_config(self, actor_id: int) -> rlfleet_pb2.RunConfig:
        """What actor `actor_id` needs to start collecting (its env seeds follow from its id)."""
        return rlfleet_pb2.RunConfig(
            algo=self.algo,
            env_id=self.env_id,
            replay_address=self.replay_for_actors,
            table=self.agent.table,
            num_envs=self.config.envs_per_actor,
            unroll_length=self.agent.unroll_length,
            seed=self.seed + 1000 * (actor_id + 1),
            network=self.network_spec,
            env_backend=self.env_backend,
        )

    def record_heartbeat(self, request: rlfleet_pb2.HeartbeatRequest, address: str) -> bool:
        """Books a heartbeat (re-admitting an actor that was away) and its finished episodes, and drops an
        actor whose heartbeat says it is leaving; returns whether the actor must stop (the run is over)."""
        with self.lock:
            rejoined = self.registry.heartbeat(
                request.actor_id,
                request.env_steps,
                request.policy_version,
                time.monotonic(),
                host=request.host,
                address=address,
                num_envs=request.num_envs,
            )
            self.recent_returns.extend(request.episode_returns)
            if request.leaving:  # its last heartbeat: status drops it now (its env steps stay counted)
                self.registry.remove(request.actor_id)
            stop = self.run_over
        if request.leaving:
            log.info("actor %d (%s) left", request.actor_id, request.host)
        elif rejoined:
            log.info("actor %d (%s) rejoined", request.actor_id, request.host)
        return stop

    def _env_steps_locked(self) -> int:
        """The run's env steps: as the actors reported them, and at least what the learner consumed or
        dropped (heartbeats lag by up to a second)."""
        seen = self.count["consumed_env_steps"] + self.count["dropped_env_steps"]
        return max(self.registry.env_steps(), seen)

    def status_dict(self) -> dict:
        """The fields of the `Status` message (proto/rlfleet.proto), as plain Python values."""
        with self.lock:
            # The training thread adds to the counters without this lock: the env steps shown are at least
            # the consumed + dropped values shown beside them, read here before it.
            consumed = self.count["consumed_env_steps"]
            dropped = self.count["dropped_env_steps"]
            env_steps = max(self._env_steps_locked(), consumed + dropped)
            now = time.monotonic()
            self.registry.evict_stale(now)  # status never lists an actor past its timeout
            actors = self.registry.snapshot(now)
            recent = list(self.recent_returns)
            out = dict(
                algo=self.algo,
                env_id=self.env_id,
                phase=self.phase,
                fault=self.fault,
                finished=self.finished,
                learner_steps=self.count["learner_steps"],
                env_steps=env_steps,
                policy_version=self.count["policy_version"],
                weights_version=self.count["policy_version"],  # the same, under the status contract's name
                episode_return_mean=float(np.mean(recent)) if recent else math.nan,
                eval_return_mean=self.eval_return_mean,
                uptime_seconds=now - self.start_time,
                actors=actors,
                distillation_coefficient=0.0,
                kl_beta=0.0,
                teacher_eval_return_mean=math.nan,
                random_eval_return_mean=math.nan,
                dropped_env_steps=dropped,
                consumed_env_steps=consumed,
                **self.rates,
            )
            extras = self.agent.status_extras()
            phase = extras.pop("phase", None)  # an algorithm's own phase (QDagger: offline_pretraining, online)
            if phase and self.phase in ("training", "waiting_for_actors"):
                out["phase"] = phase  # evaluating / stopping / done / failed describe the run's end
            out.update(extras)
            out["algorithm_values"] = {k: float(v) for k, v in extras.items()}
        out["replay"] = list(self._replay_status)
        return out

    def _refresh_replay_status(self) -> None:
        """Reads the replay tables' sizes and counters (status shows this copy, so GetStatus never waits
        on the replay server)."""
        tables = table_status(self.replay_address, timeout_s=3)
        if self.teacher_replay:
            tables += [dict(t, table=f"teacher/{t['table']}") for t in table_status(self.teacher_replay, timeout_s=3)]
        self._replay_status = tables

    def _housekeeping_loop(self) -> None:
        while not self.stop_event.wait(1.0):
            with self.lock:
                self.registry.evict_stale(time.monotonic())
            self._refresh_replay_status()  # may take seconds when the replay server is away

    def status_proto(self) -> rlfleet_pb2.Status:
        d = self.status_dict()
        # Scalar fields of the message; an algorithm's own values beyond them travel in algorithm_values only.
        scalars = {k for k in rlfleet_pb2.Status.DESCRIPTOR.fields_by_name} - {"actors", "replay", "algorithm_values"}
        msg = rlfleet_pb2.Status(**{k: v for k, v in d.items() if k in scalars})
        msg.algorithm_values.update(d["algorithm_values"])
        for a in d["actors"]:
            msg.actors.add(**a)
        for t in d["replay"]:
            msg.replay.add(**t)
        return msg

    # ----- main loop -----

    def _publish_weights(self) -> None:
        """Publishes the agent's weights as the current policy version.

        Raises:
            NonFiniteError: a weight is NaN/inf (nothing is published).
        """
        policy_version = self.count["policy_version"]
        arrays = self.agent.export_weights()
        self._check_finite(arrays, "weights")
        msg = proto_arrays.to_proto(policy_version, arrays, self.agent.exploration())
        with self.lock:
            num_actors = len(self.registry.actors)
        msg.items_per_actor = self.agent.items_per_actor(num_actors)
        msg.item_share, msg.versions_ahead = self.agent.item_credit(num_actors)
        self.weights.publish(msg)

    def _check_finite(self, values: dict, what: str) -> None:
        """Raises NonFiniteError naming the NaN/inf entries of `values` ({name: number or array}), `what` they
        are (weights, training metrics), the settings that usually cause it, and the last finite checkpoint."""
        bad = non_finite(values)
        if not bad:
            return
        c = self.config
        fields = dataclasses.asdict(c) if dataclasses.is_dataclass(c) else vars(c)
        suspects = {k: v for k, v in fields.items() if "learning_rate" in k or "reward" in k or "lr_" in k}
        latest = self.checkpoints.latest
        raise NonFiniteError(
            f"training diverged at learner step {self.count['learner_steps']}: the {what} "
            f"{', '.join(sorted(bad)[:5])} {'is' if len(bad) == 1 else 'are'} not finite (NaN/inf). This is the "
            "learner's side, not the envs': nothing of it was published to the actors or checkpointed"
            + (f" (the last checkpoint, {latest}, is from before)" if latest else "")
            + f". Settings that usually cause it: {', '.join(f'{k}={v}' for k, v in suspects.items())}; "
            "start a new run with a lower learning rate (--set learning_rate=...) or smaller rewards."
        )

    def _sampler(self) -> None:
        """Feeds `_sample_queue` from the replay server; when the server goes away (restart, crash) it
        reconnects with backoff for up to REPLAY_OUTAGE_S seconds before giving up."""
        lost_since, backoff = None, 0.5
        while not self.stop_event.is_set():
            try:
                for sample in self.agent.samples(self.replay_address):
                    if lost_since is not None:
                        print(f"rlfleet learner: replay server {self.replay_address} is back", flush=True)
                    lost_since, backoff = None, 0.5
                    while not self.stop_event.is_set():
                        try:
                            self._sample_queue.put(sample, timeout=0.5)
                            break
                        except queue.Full:
                            continue
                    if self.stop_event.is_set():
                        return
                return
            except Exception as e:  # replay unreachable or restarted
                if self.stop_event.is_set():
                    return
                if lost_since is None:
                    lost_since = time.monotonic()
                    print(
                        f"rlfleet learner: lost the replay server {self.replay_address} ({e}); "
                        f"reconnecting for up to {REPLAY_OUTAGE_S:.0f}s",
                        flush=True,
                    )
                elif time.monotonic() - lost_since > REPLAY_OUTAGE_S:
                    self._sampler_error = e  # the main loop reports it
                    return
                self.stop_event.wait(backoff)
                backoff = min(2 * backoff, 5.0)

    def _check_replay(self) -> None:
        self._check_table(self.replay_address, f"rlfleet replay --algo {self.algo}", "the learner")
        if self.teacher_replay:
            self._check_table(self.teacher_replay, "rlfleet replay --teacher DIR", "the teacher's replay")

    def _check_table(self, address: str, start_hint: str, what: str) -> None:
        deadline = time.monotonic() + 60
        said = False
        while True:
            try:
                info = reverb.Client(address).server_info(timeout=5)
                break
            except Exception as e:
                if not said:
                    print(f"rlfleet learner: waiting up to 60 s for the replay server {address}", flush=True)
                    said = True
                if time.monotonic() > deadline:
                    raise LearnerError(
                        f"replay server {address} unreachable: {e}; start it with `{start_hint}` first."
                    ) from e
                time.sleep(1)
        table = self.agent.table
        if table not in info:
            raise LearnerError(
                f"replay server {address} has no table {table!r} "
                f"(tables: {sorted(info)}); start it with `{start_hint}`."
            )
        want = self.agent.signature()
        got = info[table].signature
        if {k: (tuple(v.shape), v.dtype) for k, v in want.items()} != {
            k: (tuple(v.shape), v.dtype) for k, v in (got or {}).items()
        }:
            shapes = lambda sig: {k: list(v.shape) for k, v in sorted((sig or {}).items())}
            raise LearnerError(
                f"replay table {table} at {address}: its signature does not match {what}: the table holds "
                f"{shapes(got)}, the learner ({self.algo} on {self.env_id}, {self.config.envs_per_actor} envs "
                f"per actor) needs {shapes(want)}. Start `rlfleet replay` and `rlfleet learner` with the same "
                "--algo, --env, --config and --set values (for a teacher's replay: the same n_step)."
            )

    def _log_metrics(self, metrics: MetricsLog, last: dict) -> dict:
        now = time.monotonic()
        st = self.status_dict()
        dt = max(now - last["time"], 1e-6)
        self.rates = {
            "env_steps_per_second": (st["env_steps"] - last["env_steps"]) / dt,
            "learner_steps_per_second": (st["learner_steps"] - last["learner_steps"]) / dt,
        }
        extras = st["algorithm_values"]  # e.g. QDagger's distillation coefficient
        row = dict(
            time=time.time(),  # for people: the wall clock; intervals and rates use the monotonic one
            wall_seconds=self._wall_seconds(now),
            phase=st["phase"],
            **self._counts(st),
            **extras,
            episode_return_mean=st["episode_return_mean"],
            eval_return_mean=st["eval_return_mean"],
            eval_env_steps=self.eval_env_steps,  # the run's env steps when that evaluation ran (None: none yet)
            num_actors=len(st["actors"]),
            **self.rates,
            **{k: v for k, v in self.last_metrics.items() if k not in extras},
        )
        metrics.write(row)
        return dict(time=now, env_steps=st["env_steps"], learner_steps=st["learner_steps"])

    def _evaluate(self, episodes: int) -> list[float] | None:
        """The agent's evaluation returns (status and the algorithm see them); None when SIGTERM/SIGINT
        interrupted it."""
        env_steps = self._env_steps()  # actors collect on while it runs: the weights are of this point
        try:
            returns = self.agent.evaluate(episodes, evaluation.evaluation_seed(self.seed))
        except evaluation.EvaluationInterrupted:
            return None
        with self.lock:
            self.eval_return_mean = float(np.mean(returns))
            self.eval_env_steps = env_steps
        self.agent.on_evaluation(returns, self._env_steps())
        return returns

    def _save(self) -> str:
        with self.lock:
            self.count["env_steps"] = self._env_steps_locked()
            for name, variable in self.counters.items():
                variable.assign(self.count[name])
            # Actors away (timed out, or of the old learner and not rejoined yet) keep their place.
            book = self.registry.progress()
            progress = dict(
                next_actor_id=book["next_actor_id"],
                wall_seconds=self._wall_seconds(time.monotonic()),
                actor_env_steps={str(i): n for i, n in book["actor_env_steps"].items()},
            )
        self._check_finite(self.agent.export_weights(), "weights")  # a checkpoint is always a finite one
        self.agent.sync_to_checkpoint()
        return self.checkpoints.save(progress)

    def _checkpoint_replay(self) -> str | None:
        """Has the replay server write a Reverb checkpoint; returns the folder it keeps its checkpoints in when
        that is this run directory's replay/ (None, with a warning, when the checkpoint failed or went
        elsewhere)."""
        inside = os.path.join(os.path.abspath(self.logdir), REPLAY_SUBDIR)
        try:
            path = checkpoint_replay(self.replay_address, root=inside)
        except (ReplayCheckpointError, StorageError) as e:
            print(f"rlfleet learner: warning: {e}", flush=True)
            return None
        if path is None:
            print(
                "rlfleet learner: warning: the replay server checkpointed outside this run directory; start "
                f"`rlfleet replay` with --checkpoint-dir {shlex.quote(inside)} so that the run directory can serve "
                "as a teacher.",
                flush=True,
            )
            return None
        print(f"rlfleet learner: replay checkpoint {path}", flush=True)
        return os.path.dirname(path)

    def _run_identity(self, **more) -> dict:
        """The summary's first fields: algo, env_id, preset, seed, total_steps (the env-step budget; 0: none),
        then `more`."""
        return dict(
            algo=self.algo, env_id=self.env_id, preset=self.preset, seed=self.seed, total_steps=self.total_steps, **more
        )

    @staticmethod
    def _counts(st: dict) -> dict:
        """The run's counters in a status dict, as metrics rows and summary.json name them."""
        return dict(
            env_steps=st["env_steps"],
            learner_steps=st["learner_steps"],
            policy_version=st["policy_version"],
            weights_version=st["policy_version"],  # the same, under the status contract's name
            consumed_env_steps=st["consumed_env_steps"],
            dropped_env_steps=st["dropped_env_steps"],
        )

    def _fail(self, fault: str) -> None:
        """Training diverged: status shows `fault` (phase "failed"), actors are told to stop, summary.json
        records it beside the last (finite) checkpoint; status stays readable for `linger_s` seconds."""
        with self.lock:
            self.fault, self.phase, self.run_over = fault, "failed", True
        summary = self._run_identity(completed=False)
        summary.update(
            fault=fault,
            final_eval_return_mean=None,
            final_eval_episodes=0,
            **self._counts(self.status_dict()),
            checkpoint=self.checkpoints.latest,
            config=json.loads(self.config.to_json()),
        )
        write_json(os.path.join(self.logdir, "summary.json"), summary)
        with self.lock:
            self.finished = True
        if self.linger_s:
            self.stop_event.wait(self.linger_s)  # SIGTERM ends it

    def _request_stop(self) -> None:
        """SIGTERM/SIGINT: the training loop stops at its next step, an evaluation in progress at its next
        env step; then the learner checkpoints and exits."""
        self.stop_event.set()
        evaluation.STOP.set()

    def _wall_seconds(self, now: float) -> float:
        """Seconds this run has trained, summed over its processes (a resumed run continues the count)."""
        return self.earlier_wall_s + now - self.start_time

    def _env_steps(self) -> int:
        with self.lock:
            return self._env_steps_locked()

    def run(self) -> dict:
        """Serves and trains until `total_steps` env steps or SIGTERM/SIGINT; returns the summary.

        Raises:
            LearnerError: the replay server is unreachable or lost for good; NonFiniteError (a LearnerError):
                training diverged (status showed the fault; the last checkpoint is a finite one).
            rlfleet.deploy.files.StorageError: a checkpoint could not be written (full disk); the last good
                checkpoint stays, and the run can be resumed once there is space.
        """
        evaluation.STOP.clear()
        self._threads: list[threading.Thread] = []
        self._metrics: MetricsLog | None = None
        try:
            return self._serve_and_train()
        except NonFiniteError as e:
            self._fail(str(e))
            raise
        except StorageError as e:  # a full disk: status shows it; no summary (it could not be written either)
            with self.lock:
                self.fault, self.phase = str(e), "failed"
            raise
        finally:
            self.stop_event.set()
            self.server.stop(grace_s=1.0)
            for t in self._threads:
                t.join(timeout=10)  # no Reverb call may be in flight when the interpreter exits
            if self._metrics is not None:
                self._metrics.close()

    def _serve_and_train(self) -> dict:
        self._start_serving()
        metrics = self._metrics = MetricsLog(self.logdir)
        last = dict(time=time.monotonic(), env_steps=self._env_steps(), learner_steps=self.count["learner_steps"])
        completed, last = self._train(metrics, last)
        return self._finish(completed, metrics, last)

    def _start_serving(self) -> None:
        """Checks the replay tables, starts the housekeeping thread, publishes the first weights, starts the gRPC
        service and the algorithm (`Agent.on_start`), then the sampler thread."""
        self._check_replay()
        self._refresh_replay_status()
        status_thread = threading.Thread(target=self._housekeeping_loop, daemon=True, name="housekeeping")
        status_thread.start()
        self._threads.append(status_thread)
        if self.agent.ready_for_actors():
            self._publish_weights()
        self.server.start()
        print(f"rlfleet learner: serving on {self.address} (env {self.env_id}, preset {self.preset})", flush=True)
        print(f"rlfleet learner: {compute_device()}", flush=True)
        on_stop_signals(self._request_stop)
        try:
            self.agent.on_start()  # e.g. QDagger's teacher and random-policy evaluations
        except evaluation.EvaluationInterrupted:
            pass  # the training loop sees the stop at once
        gc.collect()  # cyclic garbage of the start-up would be kept for good once frozen
        gc.freeze()  # see `_apply`, at the first update
        self._frozen_after_update = False
        threading.Thread(target=self._sampler, daemon=True, name="sampler").start()

    def _train(self, metrics: MetricsLog, last: dict) -> tuple[bool, dict]:
        """The training loop: samples to the agent, results to the counters, weights, evaluations and
        checkpoints, until the env-step budget (returns completed=True) or a stop; also returns the last
        metrics row's counts.

        Raises:
            LearnerError: the replay server was lost for longer than `REPLAY_OUTAGE_S`.
        """
        last_ckpt = time.monotonic()
        while not self.stop_event.is_set():
            if time.monotonic() - last["time"] >= self.report_interval_s:
                last = self._log_metrics(metrics, last)
            env_steps = self._env_steps()
            if self.total_steps and env_steps >= self.total_steps:
                return True, last
            if self._sampler_error is not None:
                raise LearnerError(
                    f"lost the replay server {self.replay_address} for more than "
                    f"{REPLAY_OUTAGE_S:.0f}s: {self._sampler_error}; restart it (an algorithm that keeps "
                    "its replay: with the same --checkpoint-dir, so that it restores its tables) and "
                    "resume this run with --resume."
                )
            try:
                sample = self._sample_queue.get(timeout=0.5)
            except queue.Empty:
                with self.lock:
                    num_actors = len(self.registry.actors)
                result = self.agent.on_idle(self.count["policy_version"], env_steps, num_actors)
                if result is None:
                    continue
            else:
                with self.lock:
                    self.phase = "training"
                result = self.agent.consume(sample, self.count["policy_version"], env_steps)
            self._apply(result)
            if time.monotonic() - last_ckpt >= self.checkpoint_interval_s:
                self._save()
                last_ckpt = time.monotonic()
        return False, last

    def _apply(self, result: StepResult) -> None:
        """What one consumed sample did: counters, a new policy version published, an evaluation when due.

        Raises:
            NonFiniteError: a NaN/inf loss, or NaN/inf weights to publish.
        """
        if result.metrics:
            self._check_finite({k: v for k, v in result.metrics.items() if "loss" in k}, "losses")
            self.last_metrics = result.metrics
        self.count["learner_steps"] += result.gradient_steps
        self.count["consumed_env_steps"] += result.consumed
        self.count["dropped_env_steps"] += result.dropped
        if result.updated:
            self.count["updates"] += 1
            self.count["policy_version"] += 1
            self._publish_weights()
            if not self._frozen_after_update:
                # TensorFlow's modules and the traced graphs are hundreds of thousands of Python objects that live
                # as long as the learner: frozen, the garbage collector no longer walks them. Walking them paused every
                # thread for a noticeable time with hundreds of actors (the gRPC server's calls make garbage
                # fast): status and heartbeats waited for it.
                gc.collect()
                gc.freeze()
                self._frozen_after_update = True
        scheduled = result.updated and self.count["updates"] % self.config.eval_every_updates == 0
        if result.evaluate or scheduled:
            self._evaluate(self.config.eval_episodes)  # None: interrupted by a stop, which the loop sees next

    def _finish(self, completed: bool, metrics: MetricsLog, last: dict) -> dict:
        """The run's end: the final evaluation (when the budget was reached), the last checkpoint (and the
        replay's, for a run that can teach), the last metrics row and summary.json; returns the summary."""
        c = self.config
        with self.lock:
            self.run_over = completed
            self.phase = "evaluating" if completed else "stopping"
        summary = self._run_identity(completed=completed, status_address=self.address)
        returns = self._evaluate(c.eval_episodes) if completed else None
        # After the final evaluation, which the algorithm sees too (QDagger's λ may move with it).
        summary.update({k: v for k, v in self.agent.status_extras().items() if k != "phase"})
        if returns is None and completed:  # SIGTERM/SIGINT during the final evaluation: --resume runs it
            completed = summary["completed"] = False
        if returns is not None:
            summary.update(
                final_eval_return_mean=float(np.mean(returns)),
                final_eval_episodes=len(returns),
                final_eval_returns=returns,
            )
        else:  # stopped early, or SIGTERM/SIGINT during the final evaluation
            summary.update(final_eval_return_mean=None, final_eval_episodes=0)
        path = self._save()
        if completed and self.algorithm.keeps_replay:  # the run directory can become a teacher
            summary["replay_checkpoint_dir"] = self._checkpoint_replay()
        self._log_metrics(metrics, last)
        self._refresh_replay_status()
        st = self.status_dict()
        summary.update(
            **self._counts(st),
            replay=st["replay"],
            wall_seconds=self._wall_seconds(time.monotonic()),
            checkpoint=path,
            config=json.loads(c.to_json()),
        )
        write_json(os.path.join(self.logdir, "summary.json"), summary)
        with self.lock:
            self.phase = "done"
            self.finished = completed
        print(f"rlfleet learner: {'finished' if completed else 'stopped'}; checkpoint {path}", flush=True)
        if completed and self.linger_s:
            self.stop_event.wait(self.linger_s)  # let actors see stop=True and status be read
        return summary


def compute_device() -> str:
    """Where TensorFlow runs the learner's networks, in words: TensorFlow places every op on the first GPU it sees
    (the image or install with the `gpu` extra, an NVIDIA driver, and for a container a GPU given to it), else on
    the CPU."""
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        build = "a CPU-only TensorFlow build" if not tf.test.is_built_with_cuda() else "no GPU visible to TensorFlow"
        return f"networks on the CPU ({build}; {os.cpu_count()} cores)"
    name = tf.config.experimental.get_device_details(gpus[0]).get("device_name", "unknown")
    more = f"; {len(gpus) - 1} more GPU(s) unused" if len(gpus) > 1 else ""
    return f"networks on {gpus[0].name.replace('/physical_device:', '')} ({name}{more})"


def make_agent(
    algo: str,
    spec,
    config,
    seed: int,
    teacher: str | None = None,
    teacher_replay: str | None = None,
    total_steps: int = 0,
) -> Agent:
    """The learner-side object of the registered algorithm `algo` (`AlgorithmBuilder.make_agent`).

    `total_steps` is the run's env-step budget (0: none), for schedules that end with the run; `teacher`
    and `teacher_replay` go to algorithms that use a teacher.

    Raises:
        UnknownAlgorithmError (a ValueError): no such algorithm; TeacherError: a teacher that does not fit.
    """
    alg = algorithms.get(algo)
    if not alg.uses_teacher:
        teacher = teacher_replay = None
    return alg.make_agent(spec, config, seed, total_steps, teacher=teacher, teacher_replay=teacher_replay)
