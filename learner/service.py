"""The learner process: the training loop of one algorithm, and what ties the learner's parts together.

The learner is split by job, all built from one `RunSpec` (`rlfleet.learner.run_spec`): the algorithm's update
rule is its `Agent` (`rlfleet.algorithms.base`, made by the registry: `rlfleet.algorithms`); the replay tables'
checks, samples and status copy are a `ReplayFeed` (`rlfleet.learner.replay_feed`); what status and the metrics
rows show is built by `rlfleet.learner.status`; the checkpoints of the run's progress are
`rlfleet.learner.progress`; summary.json's content is `rlfleet.learner.summary`; the actors' book is an
`ActorRegistry` (`rlfleet.learner.actor_registry`); the run directory's other files are written by
`rlfleet.learner.run_dir`; and the gRPC face is `rlfleet.learner.servicer`. This module holds the set-up, the
training loop and the run's end.

Threads:
- main: reads batches from the replay feed, updates, publishes weights,
  evaluates, checkpoints and writes metrics; stops at `total_steps` env steps.
- sampler (`ReplayFeed`): pulls items out of Reverb into a small local queue; reconnects when
  the replay server restarts.
- housekeeping: once a second, reads the replay tables' counters for status and removes actors whose
  heartbeats stopped from the actor registry.
- gRPC workers: RegisterActor, StreamWeights, Heartbeat, GetStatus, health.
All state shared with the gRPC threads is guarded by `Learner.lock`.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import numbers
import os
import queue
import threading
import time

import numpy as np

from rlfleet import algorithms
from rlfleet.algorithms.base import ReplaySource, StepResult
from rlfleet.algorithms.library import evaluation
from rlfleet.algorithms.library.networks import compute_device
from rlfleet.algorithms.settings import RunSettings
from rlfleet.common.addresses import host_port
from rlfleet.common.files import StorageError, check_writable
from rlfleet.common.logs import NOTICE, logger
from rlfleet.common.stopping import on_stop_signals
from rlfleet.envs.core import env_identity, env_spec
from rlfleet.learner.actor_registry import ActorRegistry, ActorSeen
from rlfleet.learner.errors import LearnerError, LearnerStopped, NonFiniteError, check_finite
from rlfleet.learner.progress import COUNTERS, ProgressCheckpoints, checkpoint_run_replay, read_best
from rlfleet.learner.replay_feed import ReplayFeed
from rlfleet.learner.run_dir import (
    ACTOR_IDS_FILE,
    MetricsLog,
    check_run_dir,
    read_next_actor_id,
    read_progress,
    write_json,
)
from rlfleet.learner.run_spec import RunSpec
from rlfleet.learner.servicer import LearnerServer, WeightsBroadcast, bind_learner_server
from rlfleet.learner.status import RunStatus, status_message
from rlfleet.learner.summary import FinalEvaluation, end_summary, failure_summary
from rlfleet.proto import arrays as proto_arrays
from rlfleet.proto import rlfleet_pb2

log = logger("learner")

# After the run's end (`Learner._linger`): seconds between looks at who is still there; the least time it serves
# on (actors that left ask for status every 2 s, `rlfleet.actors.actor.RUN_END_POLL_S`, until they see the end);
# seconds without an answer that say the replay server has stopped; how recent (seconds before the end) an
# answer of the replay server must be for it to count as running at the end.
LINGER_POLL_S = 1.0
LINGER_MIN_S = 5.0
LINGER_REPLAY_GONE_S = 3.0
LINGER_REPLAY_RECENT_S = 5.0


class Learner:
    """Learner service for one registered algorithm (`rlfleet.algorithms`), built from a `RunSpec`.

    Raises:
        EnvError / ValueError / LearnerError / RunDirError: bad env, preset, replay table or run directory.
        TeacherError (a ValueError): the teacher is not a usable teacher for the env.
        rlfleet.common.files.StorageError: the run directory cannot be written.
    """

    def __init__(self, run: RunSpec, server: LearnerServer | None = None, stop_event: threading.Event | None = None):
        """`server`: the learner's gRPC server when the caller bound it already (to answer status while it waited
        for the settings: `LearnerServer.serve_waiting`); None: bound here, on `run.bind`:`run.port`.
        `stop_event`: the caller's stop (set by its SIGTERM/SIGINT handler before `run` installs the learner's own);
        one set before the learner serves ends `run` with `LearnerStopped`."""
        self.run_spec = run
        identity = self._setup_algorithm(run)
        progress = self._setup_checkpoints(run)
        write_json(os.path.join(run.logdir, "run.json"), identity.to_json())
        self._setup_state(run, progress, stop_event)
        self.server = server or bind_learner_server(None, run.bind, run.port, run.tls, run.token)
        self.server.attach(self)  # status is this learner's from now on; actors' calls wait for `start`
        self.port = self.server.port
        self.address = host_port(run.bind, self.port)

    def _replay_sources(self, run: RunSpec, settings: RunSettings) -> tuple[ReplaySource, ...]:
        """The algorithm's replay sources for `settings`, each at the address `run.replay_sources` gives it.

        Raises:
            LearnerError: a source without an address, or an address for a source the run does not have."""
        wanted = self.algorithm.replay_sources(settings)
        names = [w.name for w in wanted]
        unknown = sorted(set(run.replay_sources) - set(names))
        if unknown:
            raise LearnerError(
                f"--replay-source {', '.join(unknown)}: a {settings.algo} run has "
                f"{'the replay sources ' + ', '.join(names) if names else 'no replay source'}; leave it out."
            )
        missing = [w for w in wanted if not run.replay_sources.get(w.name)]
        if missing:
            w = missing[0]
            raise LearnerError(
                f"--algo {settings.algo} reads the replay of its {w.name} ({w.run_dir}): serve it with `rlfleet "
                f"replay --teacher {w.run_dir} --checkpoint-dir COPY_DIR --port PORT` and give the learner "
                f"--replay-source {w.name}=HOST:PORT."
            )
        return tuple(w._replace(address=run.replay_sources[w.name]) for w in wanted)

    def _setup_algorithm(self, run: RunSpec) -> RunSettings:
        """The env, settings and agent of the run, checked against the run directory; returns what run.json
        records."""
        self.spec = env_spec(run.settings.env_id)
        self.env_identity = env_identity(run.settings.env_id)  # actors compare theirs at registration
        algorithms.require_action_kind(self.spec, run.settings.algo)
        self.config = run.settings.config
        check_writable(run.logdir, "the run directory")  # StorageError: read-only, no permission, full
        self.algorithm = algorithms.get(run.settings.algo)
        if self.algorithm.uses_teacher and not run.settings.teacher:
            raise LearnerError(f"--algo {run.settings.algo} needs --teacher DIR (the run directory it learns from).")
        # An algorithm without a teacher records none.
        identity = run.settings if self.algorithm.uses_teacher else dataclasses.replace(run.settings, teacher=None)
        self.sources = self._replay_sources(run, identity)
        check_run_dir(run.logdir, run.resume, identity)
        s = run.settings
        self.agent = self.algorithm.make_agent(self.spec, self.config, s.seed, s.total_steps, self.sources)
        extras = {k: v for k, v in self.agent.status_extras().items() if k != "phase"}
        if not all(isinstance(v, numbers.Real) for v in extras.values()):
            raise LearnerError(
                f"algorithm {run.settings.algo}: status_extras() must give numbers (besides 'phase'), not {extras}."
            )
        try:
            self.network_spec = rlfleet_pb2.NetworkSpec(**self.agent.actor_network())
        except (ValueError, TypeError) as e:
            raise LearnerError(
                f"algorithm {run.settings.algo}: its actor_network() does not fit the NetworkSpec message ({e}); use "
                "the fields of NetworkSpec in proto/rlfleet.proto."
            ) from None
        if getattr(self.config, "lr_schedule", "constant") == "linear" and not run.settings.total_steps:
            log.warning(
                "lr_schedule = linear anneals over --total-steps, which is not set; the learning rate stays "
                "constant (pass --total-steps, or --set lr_schedule=constant)."
            )
        return identity

    def _setup_checkpoints(self, run: RunSpec) -> dict:
        """The run's checkpoints (`ProgressCheckpoints`) and counters (`count`: {name: int}), with `resume`
        restored from its newest intact checkpoint; returns the restored progress record (`read_progress`)."""
        self.checkpoints = ProgressCheckpoints(self.agent, run.logdir)
        self.best = read_best(run.resume) if run.resume else None  # the best evaluation so far, kept on disk
        self.evaluation_error: str | None = None  # why the latest evaluation was skipped (the env raised)
        if not run.resume:
            self.count = dict.fromkeys(COUNTERS, 0)
            return read_progress(None)
        self.count, progress = self.checkpoints.restore(run.resume, run.settings.total_steps)
        return progress

    def _setup_state(self, run: RunSpec, progress: dict, stop_event: threading.Event | None) -> None:
        """The service's state: locks, the run's status, the actors' book, the replay feed, the weights
        broadcast."""
        self.lock = threading.Lock()
        self._actor_ids_lock = threading.Lock()  # RUN/actor_ids.json
        self.stop_event = stop_event or threading.Event()  # SIGTERM/SIGINT or end of run
        self.run_over = False  # actors are told to stop
        self.final_env_steps: int | None = None  # the run's env steps at its end, as summary.json gives them
        # Phase, fault, returns, rates; its wall-clock count continues the seconds this run trained in earlier
        # processes (up to the restored checkpoint).
        self.status = RunStatus(
            run.settings.algo, run.settings.env_id, progress["wall_seconds"], progress["evaluation_seconds"]
        )
        self.status.phase, self.status.waiting_for = "waiting_for_replay", run.replay_address
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
        self.last_metrics: dict = {}
        self.videos = evaluation.EvaluationVideos(run.logdir, run.settings.env_id, run.video_every)
        if run.video_every:
            try:
                self.agent.policy(False, 0)
            except NotImplementedError as e:
                raise LearnerError(f"--video-every: {e}") from None
        self.weights = WeightsBroadcast()
        self.feed = ReplayFeed(self.agent, run.replay_address, self.sources, self.stop_event)

    # ----- called by the servicer (gRPC worker threads) -----

    def admit_actor(self, host: str, address: str) -> int:
        """Registers a new actor; returns its id."""
        with self.lock:
            actor_id = self.registry.register(host, address, self.config.envs_per_actor, time.monotonic())
        # Written (and synced) outside the learner's lock, which heartbeats and status wait on; the count only
        # grows and is read under the file's own lock, so the file never goes back.
        with self._actor_ids_lock:
            write_json(
                os.path.join(self.run_spec.logdir, ACTOR_IDS_FILE), dict(next_actor_id=self.registry.next_actor_id)
            )
        log.info("actor %d registered from %s", actor_id, host)
        return actor_id

    def run_config(self, actor_id: int) -> rlfleet_pb2.RunConfig:
        """What actor `actor_id` needs to start collecting (its env seeds follow from its id)."""
        run = self.run_spec
        return rlfleet_pb2.RunConfig(
            algo=run.settings.algo,
            env_id=run.settings.env_id,
            replay_address=run.replay_for_actors or run.replay_address,
            table=self.agent.table,
            num_envs=self.config.envs_per_actor,
            unroll_length=self.agent.unroll_length,
            envs_per_item=self.agent.envs_per_item,
            seed=run.settings.seed + 1000 * (actor_id + 1),
            network=self.network_spec,
            env_backend=run.env_backend,
            env_timeout_s=run.env_timeout_s,
        )

    def record_heartbeat(self, request: rlfleet_pb2.HeartbeatRequest, address: str) -> bool:
        """Books a heartbeat (re-admitting an actor that was away) and its finished episodes, and drops an
        actor whose heartbeat says it is leaving; returns whether the actor must stop (the run is over)."""
        with self.lock:
            seen = ActorSeen(request.host, address, request.num_envs, request.env_backend, request.env_backend_reason)
            now = time.monotonic()
            rejoined = self.registry.heartbeat(request.actor_id, request.env_steps, request.policy_version, now, seen)
            self.status.recent_returns.extend(request.episode_returns)
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
        dropped (heartbeats lag by up to a second); once summary.json is written, its count (heartbeats that
        arrive later, while status is still served, change no count of the run)."""
        if self.final_env_steps is not None:
            return self.final_env_steps
        seen = self.count["consumed_env_steps"] + self.count["dropped_env_steps"]
        return max(self.registry.env_steps(), seen)

    def status_dict(self, final: bool = False) -> dict:
        """The fields of the `Status` message (proto/rlfleet.proto), as plain Python values
        (`rlfleet.learner.status.RunStatus.fields`, and replay: the tables' last copy). `final`: those of the
        run's end, for summary.json; status keeps their env steps from then on."""
        with self.lock:
            # The training thread adds to the counters without this lock: the env steps shown are at least
            # the consumed + dropped values shown beside them, read here before it.
            count = dict(self.count)
            env_steps = self._env_steps_locked()  # reads the counters after the copy: at least its consumed + dropped
            if final:
                self.final_env_steps = env_steps
            now = time.monotonic()
            self.registry.evict_stale(now)  # status never lists an actor past its timeout
            out = self.status.fields(count, env_steps, self.registry.snapshot(now), now, self.agent.status_extras())
        out["replay"] = self.feed.tables()
        return out

    def status_proto(self) -> rlfleet_pb2.Status:
        """The `Status` message of `status_dict` (the GetStatus RPC)."""
        return status_message(self.status_dict())

    def _env_steps(self) -> int:
        with self.lock:
            return self._env_steps_locked()

    def _housekeeping_loop(self) -> None:
        while not self.stop_event.wait(1.0):
            with self.lock:
                self.registry.evict_stale(time.monotonic())
            self.feed.refresh_status()  # may take seconds when the replay server is away

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
        msg.item_share, msg.max_policy_lag = self.agent.item_credit(num_actors)
        self.weights.publish(msg)

    def _check_finite(self, values: dict, what: str) -> None:
        """Raises NonFiniteError when an entry of `values` is NaN/inf (`rlfleet.learner.errors.check_finite`)."""
        check_finite(values, what, self.config, self.count["learner_steps"], self.checkpoints.latest)

    def _request_stop(self) -> None:
        """SIGTERM/SIGINT: the training loop stops at its next step, an evaluation in progress at its next
        env step; then the learner checkpoints and exits."""
        self.stop_event.set()
        evaluation.STOP.set()

    def run(self) -> dict:
        """Serves and trains until `total_steps` env steps or SIGTERM/SIGINT; returns the summary.

        Raises:
            LearnerError: the replay server is unreachable or lost for good; NonFiniteError (a LearnerError):
                training diverged (status showed the fault; the last checkpoint is a finite one).
            rlfleet.common.files.StorageError: a checkpoint could not be written (full disk); the last good
                checkpoint stays, and the run can be resumed once there is space.
        """
        evaluation.STOP.clear()
        evaluation.WATCH.update(timeout_s=self.run_spec.env_timeout_s, on_stuck=self._save_before_ending)
        self._threads: list[threading.Thread] = []
        self._metrics: MetricsLog | None = None
        try:
            return self._serve_and_train()
        except NonFiniteError as e:
            self._fail(str(e))
            raise
        except StorageError as e:  # a full disk: status shows it; no summary (it could not be written either)
            with self.lock:
                self.status.fault, self.status.phase = str(e), "failed"
            raise
        finally:
            self.stop_event.set()
            evaluation.STOP.set()  # a video being rendered (the run failed or stopped) is abandoned, not cut off
            evaluation.WATCH["on_stuck"] = None
            self.videos.close(timeout=10)
            self.server.stop(grace_s=1.0)
            for t in self._threads:
                t.join(timeout=10)  # no Reverb call may be in flight when the interpreter exits
            if self._metrics is not None:
                self._metrics.close()

    def _serve_and_train(self) -> dict:
        self._start_serving()
        metrics = self._metrics = MetricsLog(self.run_spec.logdir, self._open_trackers())
        last = dict(time=time.monotonic(), env_steps=self._env_steps(), learner_steps=self.count["learner_steps"])
        completed, last = self._train(metrics, last)
        return self._finish(completed, metrics, last)

    def _open_trackers(self) -> dict:
        """The experiment trackers of `--track` and of the run directory's record (`rlfleet.learner.trackers`),
        their runs named after the run directory, with the run's settings as parameters."""
        run = self.run_spec
        from rlfleet.learner.trackers import open_trackers

        params = dict(
            algo=run.settings.algo,
            env_id=run.settings.env_id,
            preset=run.settings.preset,
            seed=run.settings.seed,
            total_steps=run.settings.total_steps,
        )
        params.update(dataclasses.asdict(self.config))
        return open_trackers(run.track, run.logdir, os.path.basename(os.path.abspath(run.logdir)), params)

    def _start_serving(self) -> None:
        """Answers status while it waits for the replay servers (phase waiting_for_replay) and checks their
        tables, starts the housekeeping thread, publishes the first weights, opens the gRPC service to actors,
        starts the algorithm (`Agent.on_start`), then the sampler thread.

        Raises:
            LearnerStopped: SIGTERM/SIGINT came while it waited.
            LearnerError: a replay server did not answer within `RunSpec.start_timeout_s`, or has no fitting table.
        """
        run = self.run_spec
        on_stop_signals(self._request_stop)
        if self.stop_event.is_set():  # a stop that came while the learner was built
            raise LearnerStopped("stopped before it served")
        self.server.serve_waiting()  # status is this learner's: phase waiting_for_replay
        deadline = run.start_deadline if run.start_deadline is not None else time.monotonic() + run.start_timeout_s
        self.feed.check_tables(
            run.settings.algo,
            run.settings.env_id,
            self.config.envs_per_actor,
            deadline,
            run.start_timeout_s,
            self._waiting_for_replay,
        )
        with self.lock:
            self.status.phase, self.status.waiting_for = "waiting_for_actors", ""
        self.feed.refresh_status()
        status_thread = threading.Thread(target=self._housekeeping_loop, daemon=True, name="housekeeping")
        status_thread.start()
        self._threads.append(status_thread)
        if self.agent.ready_for_actors():
            self._publish_weights()
        self.server.start()
        log.info("serving on %s (env %s, preset %s)", self.address, run.settings.env_id, run.settings.preset)
        log.info("%s", compute_device())
        try:
            self.agent.on_start()  # e.g. QDagger's teacher and random-policy evaluations
        except evaluation.EvaluationInterrupted:
            pass  # the training loop sees the stop at once
        gc.collect()  # cyclic garbage of the start-up would be kept for good once frozen
        gc.freeze()  # see `_apply`, at the first update
        self._frozen_after_update = False
        self.feed.start()

    def _waiting_for_replay(self, address: str) -> None:
        with self.lock:
            self.status.waiting_for = address

    def _train(self, metrics: MetricsLog, last: dict) -> tuple[bool, dict]:
        """The training loop: samples to the agent, results to the counters, weights, evaluations and
        checkpoints, until the env-step budget (returns completed=True) or a stop; also returns the last
        metrics row's counts.

        Raises:
            LearnerError: the replay server was lost for longer than
                `rlfleet.learner.replay_feed.REPLAY_OUTAGE_S`.
        """
        run = self.run_spec
        last_ckpt = time.monotonic()
        while not self.stop_event.is_set():
            if time.monotonic() - last["time"] >= run.report_interval_s:
                last = self._log_metrics(metrics, last)
            env_steps = self._env_steps()
            if run.settings.total_steps and env_steps >= run.settings.total_steps:
                return True, last
            try:
                sample = self.feed.take(timeout_s=0.5)
            except queue.Empty:
                with self.lock:
                    num_actors = len(self.registry.actors)
                result = self.agent.on_idle(self.count["policy_version"], env_steps, num_actors)
                if result is None:
                    continue
            else:
                with self.lock:
                    self.status.phase = "training"
                result = self.agent.consume(sample, self.count["policy_version"], env_steps)
            self._apply(result)
            if time.monotonic() - last_ckpt >= run.checkpoint_interval_s:
                self._save()
                last_ckpt = time.monotonic()
        return False, last

    def _apply(self, result: StepResult) -> None:
        """What one consumed sample did: counters, a new policy version published, an evaluation when due.

        Raises:
            NonFiniteError: a NaN/inf loss, or NaN/inf weights to publish.
        """
        own_row = result.updated and result.metrics and self.agent.metrics_every_update
        if result.metrics:
            self._check_finite({k: v for k, v in result.metrics.items() if "loss" in k}, "losses")
            if not own_row:
                self.last_metrics = result.metrics
        self.count["learner_steps"] += result.gradient_steps
        self.count["consumed_env_steps"] += result.consumed
        self.count["dropped_env_steps"] += result.dropped
        if result.updated:
            self.count["updates"] += 1
            self.count["policy_version"] += 1
            if own_row and self._metrics is not None:
                row = self.status.update_row(self.count, self._env_steps(), time.monotonic(), result.metrics)
                self._metrics.write(row)
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

    def _log_metrics(self, metrics: MetricsLog, last: dict) -> dict:
        """Writes one metrics row (`RunStatus.metrics_row`, with the rates since `last`); returns its counts
        (time, env_steps, learner_steps), where the next row's rates start."""
        now = time.monotonic()
        st = self.status_dict()
        self.status.measure_rates(st, last, now)
        metrics.write(self.status.metrics_row(st, now, self.last_metrics))
        return dict(time=now, env_steps=st["env_steps"], learner_steps=st["learner_steps"])

    def _evaluate(self, episodes: int) -> list[float] | None:
        """The agent's evaluation returns (status and the algorithm see them); None when SIGTERM/SIGINT
        interrupted it, or when the env raised (`evaluation_error` says so: the evaluation is skipped, training
        goes on and nothing learned is lost)."""
        env_steps = self._env_steps()  # actors collect on while it runs: the weights are of this point
        seed = evaluation.evaluation_seed(self.run_spec.settings.seed)
        start = time.monotonic()
        self.evaluation_error = None
        try:
            returns = self.agent.evaluate(episodes, seed)
        except evaluation.EvaluationInterrupted:
            return None
        except Exception as e:  # most often the env's (a user's env that raises in reset or step): skipped
            self.evaluation_error = f"{self.spec.env_id}: its evaluation raised {type(e).__name__}: {e}"
            log.error(
                "evaluation at %d env steps skipped (episode seeds from %d): %s; training goes on. The env's "
                "traceback:",
                env_steps,
                seed,
                self.evaluation_error,
                exc_info=True,
            )
            return None
        finally:
            with self.lock:
                self.status.evaluation_seconds += time.monotonic() - start
        with self.lock:
            self.status.eval_return_mean = float(np.mean(returns))
            self.status.eval_env_steps = env_steps
        self.agent.on_evaluation(returns, self._env_steps())
        self._keep_best(float(np.mean(returns)), env_steps)
        if self.run_spec.video_every:  # the first evaluation episode again, rendered (a snapshot of the weights)
            self.videos.after_evaluation(self.agent.policy(False, seed), seed, env_steps)
        return returns

    def _save_before_ending(self) -> None:
        """Checkpoints before the process ends because an env call of an evaluation hung past its interrupt
        (`rlfleet.envs.watch.EnvWatch`); a checkpoint that cannot be written is logged."""
        try:
            log.log(NOTICE, "checkpointed %s before ending", self._save())
        except Exception:  # noqa: BLE001 - the process ends either way; the previous checkpoint stays
            log.exception("the checkpoint before ending could not be written")

    def _keep_best(self, mean: float, env_steps: int) -> None:
        """Checkpoints the agent into RUN/checkpoints/best when the evaluation's `mean` return beats every earlier
        one of the run (resumed runs included); the agent has not trained since that evaluation.

        Raises:
            NonFiniteError / StorageError: as `_save`.
        """
        if not math.isfinite(mean) or (self.best is not None and mean <= self.best["eval_return_mean"]):
            return
        path = self._save(best=(mean, env_steps))
        self.best = dict(eval_return_mean=mean, eval_env_steps=env_steps, checkpoint=path)

    def _save(self, best: tuple[float, int] | None = None) -> str:
        """Checkpoints the agent, the counters and the actors' book (`ProgressCheckpoints.save`), or with `best`
        (an evaluation's mean return and env steps) as the run's best (`save_best`); returns the checkpoint's
        path prefix.

        Raises:
            NonFiniteError: a weight is NaN/inf (nothing is written); StorageError: it could not be written.
        """
        with self.lock:
            self.count["env_steps"] = self._env_steps_locked()
            count = dict(self.count)
            # Actors away (timed out, or of the old learner and not rejoined yet) keep their place.
            actors = self.registry.progress()
            wall_seconds = self.status.wall_seconds(time.monotonic())
            evaluation_seconds = self.status.evaluation_seconds
        self._check_finite(self.agent.export_weights(), "weights")  # a checkpoint is always a finite one
        if best is not None:
            return self.checkpoints.save_best(count, actors, wall_seconds, *best, evaluation_seconds)
        return self.checkpoints.save(count, actors, wall_seconds, evaluation_seconds)

    def _finish(self, completed: bool, metrics: MetricsLog, last: dict) -> dict:
        """The run's end: the final evaluation (when the budget was reached), the last checkpoint (and the
        replay's, for a run that can teach), the last metrics row and summary.json; returns the summary."""
        run = self.run_spec
        with self.lock:
            self.run_over = completed
            self.status.phase = "evaluating" if completed else "stopping"
        returns = self._evaluate(self.config.eval_episodes) if completed else None
        self.videos.close()  # a video being rendered is written (or, on a stop, abandoned) before the run ends
        # After the final evaluation, which the algorithm sees too (QDagger's λ may move with it).
        extras = self.agent.status_extras()
        # SIGTERM/SIGINT during the final evaluation: --resume runs it; an env that raised in it: recorded
        failed_evaluation = self.evaluation_error if completed and returns is None else None
        completed = completed and (returns is not None or failed_evaluation is not None)
        path = self._save()
        more = dict(evaluation_seconds=self.status.evaluation_seconds)  # of wall_seconds, in evaluations
        if failed_evaluation:
            more["final_eval_error"] = failed_evaluation
        if completed and self.algorithm.keeps_replay:  # the run directory can become a teacher
            more["replay_checkpoint_dir"] = checkpoint_run_replay(run.replay_address, run.logdir)
        self._log_metrics(metrics, last)
        self.feed.refresh_status()
        st = self.status_dict(final=True)
        wall_seconds = self.status.wall_seconds(time.monotonic())
        final = FinalEvaluation(returns, extras)
        summary = end_summary(
            run, completed, self.address, final, st, self.best, wall_seconds=wall_seconds, checkpoint=path, **more
        )
        write_json(os.path.join(run.logdir, "summary.json"), summary)
        metrics.end_tracking(completed)
        with self.lock:
            self.status.phase = "done"
            self.status.finished = completed
        log.info("%s; checkpoint %s", "finished" if completed else "stopped", path)
        if completed:
            self._linger(run.linger_s)
        return summary

    def _linger(self, seconds: float) -> None:
        """Keeps serving status for up to `seconds` after the run's end, so that actors and the replay server see
        it is over (finished); returns sooner, or on SIGTERM/SIGINT, once they have: at least `LINGER_MIN_S`
        have passed (each actor that left has asked for status since), no actor is in the registry (each said
        it is leaving or timed out), and the run's replay server, answering at the end, has not answered the
        housekeeping thread's status reads for `LINGER_REPLAY_GONE_S` (a server that restarts is not taken for
        one that stopped). Without `linger_for_replay` (a supervisor stops the replay server and the actors after
        the learner) it returns once no actor is in the registry."""
        start = time.monotonic()
        deadline = start + seconds
        while not self.stop_event.wait(min(LINGER_POLL_S, max(0.0, deadline - time.monotonic()))):
            now = time.monotonic()
            if now >= deadline:
                with self.lock:
                    still = sorted(self.registry.actors)
                if still:
                    log.info("--linger is over, actors %s still registered; exiting", still)
                return
            last = self.feed.last_answer  # refreshed every second (`_housekeeping_loop`)
            replay_stopped = last is not None and start - LINGER_REPLAY_RECENT_S <= last <= now - LINGER_REPLAY_GONE_S
            with self.lock:
                actors_left = bool(self.registry.actors)  # evicted after their timeout by housekeeping
            if not actors_left and not self.run_spec.linger_for_replay:
                log.info("no actor is registered; exiting")
                return
            if replay_stopped and not actors_left and now - start >= LINGER_MIN_S:
                log.info("the actors and the replay server have stopped; exiting")
                return

    def _fail(self, fault: str) -> None:
        """Training diverged: status shows `fault` (phase "failed"), actors are told to stop, summary.json
        records it beside the last (finite) checkpoint; status stays readable for up to `linger_s` seconds
        (`_linger`)."""
        run = self.run_spec
        with self.lock:
            self.status.fault, self.status.phase, self.run_over = fault, "failed", True
        summary = failure_summary(run, fault, self.status_dict(final=True), self.checkpoints.latest, self.best)
        write_json(os.path.join(run.logdir, "summary.json"), summary)
        with self.lock:
            self.status.finished = True
        self._linger(run.linger_s)
