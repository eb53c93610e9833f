"""The learner process: algorithm updates on replay data plus the Learner gRPC service.

Threads:
- main: reads batches from the replay queue, updates, publishes weights,
  evaluates, checkpoints and writes metrics; stops at `total_steps` env steps.
- sampler: pulls items out of Reverb into a small local queue; reconnects when
  the replay server restarts.
- replay-status: reads the replay tables' counters once a second for status.
- gRPC workers: RegisterActor, StreamWeights, Heartbeat, GetStatus, health.
All state shared with the gRPC threads is guarded by `Learner.lock`.
"""

from __future__ import annotations

import collections
import glob
import json
import logging
import math
import os
import queue
import signal
import sys
import threading
import time
from concurrent import futures

import grpc
import numpy as np
import reverb
import tensorflow as tf
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from rlfleet.actors.envs import env_spec, require_action_kind
from rlfleet.learner.agents import Agent, PPOAgent
from rlfleet.learner.presets import make_algo_config
from rlfleet.learner.run_dir import check_run_dir, run_identity
from rlfleet.proto import arrays as proto_arrays
from rlfleet.proto import rlfleet_pb2, rlfleet_pb2_grpc, security
from rlfleet.replay.checkpoints import REPLAY_SUBDIR, ReplayCheckpointError, checkpoint_replay
from rlfleet.replay.server import table_status

log = logging.getLogger("rlfleet.learner")

ACTOR_TIMEOUT_S = 30.0  # default: an actor without heartbeat for this long leaves the status list
REPLAY_OUTAGE_S = 300.0  # how long the learner waits for a lost replay server to come back
RECENT_EPISODES = 100  # episode_return_mean is over this many recent training episodes
PROGRESS_SUFFIX = ".progress.json"  # beside each checkpoint: actor env steps, next actor id, wall time


class LearnerError(RuntimeError):
    """A learner setup problem with a message that says how to fix it."""


class _Servicer(rlfleet_pb2_grpc.LearnerServicer):
    def __init__(self, learner: "Learner"):
        self.learner = learner

    def RegisterActor(self, request, context):
        return self.learner.register_actor(request, context)

    def StreamWeights(self, request, context):
        return self.learner.stream_weights(request, context)

    def Heartbeat(self, request, context):
        return self.learner.heartbeat(request, context)

    def GetStatus(self, request, context):
        return self.learner.status_proto()


class Learner:
    """Learner service for one algorithm (BatchPPO, DQN or QDagger).

    Args:
        algo: "ppo" (continuous actions), "dqn" or "qdagger" (discrete actions).
        env_id: gymnasium id.
        replay_address: host:port of the Reverb server holding the algorithm's table.
        logdir: run directory (checkpoints/, tb/, metrics.jsonl, summary.json).
        total_steps: stop after this many env steps (0: run until stopped).
        port / bind: where the gRPC service listens (bind defaults to loopback).
        preset / overrides: hyperparameters (`rlfleet.learner.presets.make_algo_config`).
        resume: a run directory whose latest checkpoint to continue from.
        replay_host_for_actors: replay address as actors should dial it.
        teacher / teacher_replay: QDagger only: the teacher's run directory and the
            Reverb server holding its restored replay (`rlfleet replay --teacher`).
        actor_timeout_s: seconds without a heartbeat after which an actor leaves the status list
            (its env steps stay counted; a heartbeat later re-admits it).
        tls: (cert PEM path, key PEM path, client CA PEM path or None) to serve TLS; None: plaintext.
        token: shared token every `rlfleet.Learner` call must carry ("" = none; `rlfleet.proto.security`).
    Raises:
        EnvError / ValueError / LearnerError / RunDirError: bad env, preset, replay table or run directory.
        TeacherError (a ValueError): `teacher` is not a usable teacher for `env_id`.
    """

    def __init__(
        self,
        algo: str,
        env_id: str,
        replay_address: str,
        logdir: str,
        total_steps: int = 0,
        port: int = 0,
        bind: str = "127.0.0.1",
        preset: str = "default",
        overrides: dict | None = None,
        seed: int = 0,
        resume: str | None = None,
        report_interval_s: float = 5.0,
        checkpoint_interval_s: float = 120.0,
        replay_host_for_actors: str | None = None,
        env_backend: str = "auto",
        linger_s: float = 0.0,
        teacher: str | None = None,
        teacher_replay: str | None = None,
        actor_timeout_s: float = ACTOR_TIMEOUT_S,
        tls: tuple | None = None,
        token: str = "",
    ):
        self.spec = env_spec(env_id)
        require_action_kind(self.spec, algo)
        self.config = make_algo_config(algo, preset, env_id, overrides)
        self.algo, self.env_id, self.seed, self.preset = algo, env_id, seed, preset
        self.replay_address = replay_address
        self.replay_for_actors = replay_host_for_actors or replay_address
        self.logdir, self.total_steps = logdir, total_steps
        self.env_backend = env_backend
        self.report_interval_s, self.checkpoint_interval_s = report_interval_s, checkpoint_interval_s
        self.linger_s, self.actor_timeout_s = linger_s, actor_timeout_s
        os.makedirs(logdir, exist_ok=True)
        if algo == "qdagger" and not (teacher and teacher_replay):
            raise LearnerError(
                "--algo qdagger needs --teacher DIR (a finished DQN run directory) and "
                "--teacher-replay HOST:PORT (`rlfleet replay --teacher DIR`)."
            )
        run = run_identity(algo, env_id, preset, self.config.to_json(), teacher if algo == "qdagger" else None)
        self.teacher_replay = teacher_replay
        check_run_dir(logdir, resume, run)

        self.agent = make_agent(algo, self.spec, self.config, seed, teacher, teacher_replay, total_steps)
        if getattr(self.config, "lr_schedule", "constant") == "linear" and not total_steps:
            print(
                "rlfleet learner: warning: lr_schedule = linear anneals over --total-steps, which is not set; "
                "the learning rate stays constant (pass --total-steps, or --set lr_schedule=constant).",
                file=sys.stderr,
                flush=True,
            )
        self.counters = {
            k: tf.Variable(0, dtype=tf.int64)
            for k in (
                "learner_steps",
                "env_steps",
                "weights_version",
                "consumed_env_steps",
                "dropped_env_steps",
                "updates",
            )
        }
        self.ckpt = tf.train.Checkpoint(**self.agent.checkpoint_items(), **self.counters)
        self.ckpt_manager = tf.train.CheckpointManager(self.ckpt, os.path.join(logdir, "checkpoints"), 3)
        progress = _read_progress(None)
        if resume:
            latest = tf.train.latest_checkpoint(os.path.join(resume, "checkpoints"))
            if latest is None:  # check_run_dir saw the index file, but the files it names are gone
                raise LearnerError(
                    f"--resume {resume}: {resume}/checkpoints/checkpoint names no checkpoint "
                    "whose files exist; resume from an intact run directory."
                )
            self.ckpt.restore(latest).assert_existing_objects_matched()
            self.agent.sync_from_checkpoint()
            progress = _read_progress(latest)
            self.agent.on_resume(int(self.counters["env_steps"].numpy()))
            print(f"rlfleet learner: resumed from {latest}", flush=True)
        with open(os.path.join(logdir, "run.json"), "w") as f:
            json.dump(run, f, indent=2)

        self.lock = threading.Lock()
        self.weights_cond = threading.Condition(self.lock)
        self.stop_event = threading.Event()  # SIGTERM/SIGINT or end of run
        self.run_over = False  # actors are told to stop
        self.phase = "waiting_for_actors"
        self.start_time = time.time()
        self.base_env_steps = int(self.counters["env_steps"].numpy())  # restored
        self.actors: dict[int, dict] = {}
        self.departed_env_steps = 0
        # Actors not in self.actors whose env steps up to some point are already counted: those that timed
        # out, and after --resume those connected when the restored checkpoint was taken. When one of them
        # rejoins (same process, same id) it is counted from that point, so its steps in between are not lost.
        self.counted_actor_steps: dict[int, int] = progress["actor_env_steps"]
        self.next_actor_id = progress["next_actor_id"]
        # Seconds this run trained in earlier processes (up to the restored checkpoint).
        self.earlier_wall_s = progress["wall_seconds"]
        self.recent_returns = collections.deque(maxlen=RECENT_EPISODES)
        self.eval_return_mean = math.nan
        self.last_metrics: dict = {}
        self.rates = {"env_steps_per_second": 0.0, "learner_steps_per_second": 0.0}
        self.weights_msg = None
        self._sample_queue: queue.Queue = queue.Queue(maxsize=2)
        self._sampler_error: Exception | None = None
        self._replay_status: list[dict] = []

        interceptors = [security.TokenInterceptor(token)] if token else []
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=32), options=proto_arrays.GRPC_OPTIONS, interceptors=interceptors
        )
        rlfleet_pb2_grpc.add_LearnerServicer_to_server(_Servicer(self), self.server)
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        try:
            if tls:
                self.port = self.server.add_secure_port(f"{bind}:{port}", security.server_credentials(*tls))
            else:
                self.port = self.server.add_insecure_port(f"{bind}:{port}")
        except RuntimeError:
            self.port = 0
        if self.port == 0:
            raise LearnerError(
                f"cannot bind the learner service to {bind}:{port} (port in use?); "
                "choose another port (--port / --learner-port)."
            )
        self.address = f"{bind}:{self.port}"

    # ----- gRPC handlers (called on worker threads) -----

    def register_actor(self, request, context):
        c = self.config
        if request.num_envs and request.num_envs != c.envs_per_actor:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"actor asked for {request.num_envs} envs but this run's replay items hold "
                f"{c.envs_per_actor} envs per actor; start the actor without --num-envs "
                f"or with --num-envs {c.envs_per_actor}.",
            )
        with self.lock:
            actor_id = self.next_actor_id
            self.next_actor_id += 1
            self.actors[actor_id] = dict(
                host=request.host or _peer_ip(context.peer()),
                address=_peer_ip(context.peer()),
                num_envs=c.envs_per_actor,
                policy_version=-1,
                env_steps=0,
                steps_before=0,
                last_seen=time.time(),
            )
        log.info("actor %d registered from %s", actor_id, request.host)
        return rlfleet_pb2.RegisterActorResponse(
            actor_id=actor_id,
            config=rlfleet_pb2.RunConfig(
                algo=self.algo,
                env_id=self.env_id,
                replay_address=self.replay_for_actors,
                table=self.agent.table,
                num_envs=c.envs_per_actor,
                unroll_length=self.agent.unroll_length,
                seed=self.seed + 1000 * (actor_id + 1),
                network_json=json.dumps(self.agent.actor_network()),
                env_backend=self.env_backend,
            ),
        )

    def stream_weights(self, request, context):
        sent = request.min_version - 1
        while context.is_active():
            with self.weights_cond:
                if self.weights_msg is not None and sent > self.weights_msg.version:
                    sent = -1  # the actor holds a newer version than ours: we restarted from a checkpoint
                self.weights_cond.wait_for(
                    lambda sent=sent: (
                        self.stop_event.is_set() or (self.weights_msg is not None and self.weights_msg.version > sent)
                    ),
                    timeout=1.0,
                )
                if self.stop_event.is_set():
                    return
                msg = self.weights_msg
            if msg is not None and msg.version > sent:
                sent = msg.version
                yield msg

    def heartbeat(self, request, context):
        with self.lock:
            a = self.actors.get(request.actor_id)
            if a is None:
                # Timed out earlier, or registered with a learner that has since restarted from a
                # checkpoint: count from where the count left it (its last heartbeat before the timeout, or
                # the checkpoint), so that the steps it took while away are counted too.
                before = min(self.counted_actor_steps.pop(request.actor_id, request.env_steps), request.env_steps)
                a = self.actors[request.actor_id] = dict(
                    host=request.host,
                    address=_peer_ip(context.peer()),
                    num_envs=request.num_envs,
                    policy_version=-1,
                    env_steps=request.env_steps,
                    steps_before=before,
                    last_seen=0.0,
                )
                self.next_actor_id = max(self.next_actor_id, request.actor_id + 1)
                log.info("actor %d (%s) rejoined", request.actor_id, request.host)
            a.update(env_steps=request.env_steps, policy_version=request.policy_version, last_seen=time.time())
            self.recent_returns.extend(request.episode_returns)
            return rlfleet_pb2.HeartbeatResponse(stop=self.run_over)

    def _env_steps_locked(self) -> int:
        now = time.time()
        for actor_id, a in list(self.actors.items()):
            if now - a["last_seen"] > self.actor_timeout_s:
                self.departed_env_steps += a["env_steps"] - a["steps_before"]
                self.counted_actor_steps[actor_id] = a["env_steps"]
                del self.actors[actor_id]
                log.info("actor %d left the status list (no heartbeat for %.0fs)", actor_id, self.actor_timeout_s)
        reported = (
            self.base_env_steps
            + self.departed_env_steps
            + sum(a["env_steps"] - a["steps_before"] for a in self.actors.values())
        )
        # Heartbeats lag by up to a second; the learner has at least seen what it consumed or dropped.
        seen = int(self.counters["consumed_env_steps"].numpy()) + int(self.counters["dropped_env_steps"].numpy())
        return max(reported, seen)

    def status_dict(self) -> dict:
        """The fields of the `Status` message (proto/rlfleet.proto), as plain Python values."""
        with self.lock:
            # The training thread adds to the counters without this lock: the env steps shown are at least
            # the consumed + dropped values shown beside them, read here before it.
            consumed = int(self.counters["consumed_env_steps"].numpy())
            dropped = int(self.counters["dropped_env_steps"].numpy())
            env_steps = max(self._env_steps_locked(), consumed + dropped)
            now = time.time()
            actors = [
                dict(
                    actor_id=i,
                    host=a["host"],
                    address=a["address"],
                    num_envs=a["num_envs"],
                    policy_version=a["policy_version"],
                    env_steps=a["env_steps"],
                    seconds_since_heartbeat=round(now - a["last_seen"], 3),
                )
                for i, a in sorted(self.actors.items())
            ]
            recent = list(self.recent_returns)
            out = dict(
                algo=self.algo,
                env_id=self.env_id,
                phase=self.phase,
                learner_steps=int(self.counters["learner_steps"].numpy()),
                env_steps=env_steps,
                weights_version=int(self.counters["weights_version"].numpy()),
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
            if self.phase not in ("training", "waiting_for_actors"):
                extras.pop("phase", None)  # evaluating / stopping / done describe the run's end
            out.update(extras)
        out["replay"] = list(self._replay_status)
        return out

    def _refresh_replay_status(self) -> None:
        """Reads the replay tables' sizes and counters (status shows this copy, so GetStatus never waits
        on the replay server)."""
        tables = table_status(self.replay_address, timeout_s=3)
        if self.teacher_replay:
            tables += [dict(t, table=f"teacher/{t['table']}") for t in table_status(self.teacher_replay, timeout_s=3)]
        self._replay_status = tables

    def _replay_status_loop(self) -> None:
        while not self.stop_event.wait(1.0):
            self._refresh_replay_status()

    def status_proto(self) -> rlfleet_pb2.Status:
        d = self.status_dict()
        msg = rlfleet_pb2.Status(**{k: v for k, v in d.items() if k not in ("actors", "replay")})
        for a in d["actors"]:
            msg.actors.add(**a)
        for t in d["replay"]:
            msg.replay.add(**t)
        return msg

    # ----- main loop -----

    def _publish_weights(self) -> None:
        msg = proto_arrays.to_proto(int(self.counters["weights_version"].numpy()), self.agent.export_weights())
        with self.weights_cond:
            self.weights_msg = msg
            self.weights_cond.notify_all()

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
                    lost_since = time.time()
                    print(
                        f"rlfleet learner: lost the replay server {self.replay_address} ({e}); "
                        f"reconnecting for up to {REPLAY_OUTAGE_S:.0f}s",
                        flush=True,
                    )
                elif time.time() - lost_since > REPLAY_OUTAGE_S:
                    self._sampler_error = e  # the main loop reports it
                    return
                self.stop_event.wait(backoff)
                backoff = min(2 * backoff, 5.0)

    def _check_replay(self) -> None:
        self._check_table(self.replay_address, f"rlfleet replay --algo {self.algo}", "the learner")
        if self.teacher_replay:
            self._check_table(self.teacher_replay, "rlfleet replay --teacher DIR", "the teacher's replay")

    def _check_table(self, address: str, start_hint: str, what: str) -> None:
        deadline = time.time() + 60
        while True:
            try:
                info = reverb.Client(address).server_info(timeout=5)
                break
            except Exception as e:
                if time.time() > deadline:
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

    def _log_metrics(self, writer, metrics_file, last: dict) -> dict:
        now = time.time()
        st = self.status_dict()
        dt = max(now - last["time"], 1e-6)
        self.rates = {
            "env_steps_per_second": (st["env_steps"] - last["env_steps"]) / dt,
            "learner_steps_per_second": (st["learner_steps"] - last["learner_steps"]) / dt,
        }
        extras = {
            k: st[k]
            for k in ("teacher_eval_return_mean", "random_eval_return_mean", "distillation_coefficient")
            if self.algo == "qdagger"
        }
        row = dict(
            time=now,
            wall_seconds=self._wall_seconds(now),
            phase=st["phase"],
            env_steps=st["env_steps"],
            learner_steps=st["learner_steps"],
            weights_version=st["weights_version"],
            **extras,
            episode_return_mean=st["episode_return_mean"],
            eval_return_mean=st["eval_return_mean"],
            dropped_env_steps=st["dropped_env_steps"],
            consumed_env_steps=st["consumed_env_steps"],
            num_actors=len(st["actors"]),
            **self.rates,
            **{k: v for k, v in self.last_metrics.items() if k not in extras},
        )
        metrics_file.write(
            json.dumps({k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}) + "\n"
        )
        metrics_file.flush()
        with writer.as_default(step=st["env_steps"]):
            for k, v in row.items():
                if k not in ("time", "env_steps") and isinstance(v, (int, float)) and not math.isnan(v):
                    tf.summary.scalar(k, v)
        writer.flush()
        return dict(time=now, env_steps=st["env_steps"], learner_steps=st["learner_steps"])

    def _evaluate(self, episodes: int) -> list[float]:
        returns = self.agent.evaluate(episodes, self.seed + 10**6)
        with self.lock:
            self.eval_return_mean = float(np.mean(returns))
        self.agent.on_evaluation(returns, self._env_steps())
        return returns

    def _save(self) -> str:
        with self.lock:
            self.counters["env_steps"].assign(self._env_steps_locked())
            progress = dict(
                next_actor_id=self.next_actor_id,
                wall_seconds=self._wall_seconds(time.time()),
                actor_env_steps={str(i): a["env_steps"] for i, a in self.actors.items()},
            )
            # Actors away (timed out, or of the old learner and not rejoined yet) keep their place.
            progress["actor_env_steps"].update({str(i): n for i, n in self.counted_actor_steps.items()})
        self.agent.sync_to_checkpoint()
        # The record goes down before the checkpoint index names the new checkpoint, so a crash right after
        # the save never leaves a latest checkpoint without its record. The manager numbers checkpoints by
        # the (restored) save counter plus one.
        number = int(self.ckpt.save_counter.numpy()) + 1
        _write_progress(os.path.join(self.ckpt_manager.directory, f"ckpt-{number}"), progress)
        path = self.ckpt_manager.save(checkpoint_number=number)
        kept = {_progress_path(c) for c in self.ckpt_manager.checkpoints}
        for old in glob.glob(os.path.join(self.ckpt_manager.directory, "*" + PROGRESS_SUFFIX)):
            if old not in kept:
                os.remove(old)
        return path

    def _checkpoint_replay(self) -> str | None:
        """Has the replay server write a Reverb checkpoint; returns the directory it keeps its latest one in
        (warns when that lies outside this run directory)."""
        try:
            path = checkpoint_replay(self.replay_address)
        except ReplayCheckpointError as e:
            print(f"rlfleet learner: warning: {e}", flush=True)
            return None
        inside = os.path.join(os.path.abspath(self.logdir), REPLAY_SUBDIR)
        if not os.path.abspath(path).startswith(inside + os.sep):
            print(
                f"rlfleet learner: warning: the replay checkpoint went to {path}, outside this run "
                f"directory; start `rlfleet replay` with --checkpoint-dir {inside} so that the run directory "
                "can serve as a QDagger teacher.",
                flush=True,
            )
        print(f"rlfleet learner: replay checkpoint {path}", flush=True)
        return os.path.dirname(path)

    def _wall_seconds(self, now: float) -> float:
        """Seconds this run has trained, summed over its processes (a resumed run continues the count)."""
        return self.earlier_wall_s + now - self.start_time

    def _env_steps(self) -> int:
        with self.lock:
            return self._env_steps_locked()

    def run(self) -> dict:
        """Serves and trains until `total_steps` env steps or SIGTERM/SIGINT; returns the summary."""
        self._check_replay()
        self._refresh_replay_status()
        status_thread = threading.Thread(target=self._replay_status_loop, daemon=True, name="replay-status")
        status_thread.start()
        if self.agent.ready_for_actors():
            self._publish_weights()
        self.server.start()
        self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        self.health.set("rlfleet.Learner", health_pb2.HealthCheckResponse.SERVING)
        print(f"rlfleet learner: serving on {self.address} (env {self.env_id}, preset {self.preset})", flush=True)
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: self.stop_event.set())
        self.agent.on_start()
        threading.Thread(target=self._sampler, daemon=True, name="sampler").start()
        writer = tf.summary.create_file_writer(os.path.join(self.logdir, "tb"))
        metrics_file = open(os.path.join(self.logdir, "metrics.jsonl"), "a")
        c = self.config
        last = dict(
            time=time.time(), env_steps=self._env_steps(), learner_steps=int(self.counters["learner_steps"].numpy())
        )
        last_ckpt = time.time()
        completed = False
        try:
            while not self.stop_event.is_set():
                if time.time() - last["time"] >= self.report_interval_s:
                    last = self._log_metrics(writer, metrics_file, last)
                env_steps = self._env_steps()
                if self.total_steps and env_steps >= self.total_steps:
                    completed = True
                    break
                if self._sampler_error is not None:
                    raise LearnerError(
                        f"lost the replay server {self.replay_address} for more than "
                        f"{REPLAY_OUTAGE_S:.0f}s: {self._sampler_error}; restart it (DQN/QDagger: "
                        "with the same --checkpoint-dir, so that it restores its tables) and "
                        "resume this run with --resume."
                    )
                try:
                    sample = self._sample_queue.get(timeout=0.5)
                except queue.Empty:
                    continue
                with self.lock:
                    self.phase = "training"
                result = self.agent.consume(sample, int(self.counters["weights_version"].numpy()), env_steps)
                if result.metrics:
                    self.last_metrics = result.metrics
                for name, value in (
                    ("learner_steps", result.gradient_steps),
                    ("consumed_env_steps", result.consumed),
                    ("dropped_env_steps", result.dropped),
                ):
                    if value:  # most samples change one counter at most; skip the no-op variable writes
                        self.counters[name].assign_add(value)
                if result.updated:
                    self.counters["updates"].assign_add(1)
                    self.counters["weights_version"].assign_add(1)
                    self._publish_weights()
                scheduled = result.updated and int(self.counters["updates"].numpy()) % c.eval_every_updates == 0
                if result.evaluate or scheduled:
                    self._evaluate(c.eval_episodes)
                if time.time() - last_ckpt >= self.checkpoint_interval_s:
                    self._save()
                    last_ckpt = time.time()
            with self.lock:
                self.run_over = completed
                self.phase = "evaluating" if completed else "stopping"
            summary = dict(
                algo=self.algo,
                env_id=self.env_id,
                preset=self.preset,
                seed=self.seed,
                completed=completed,
                status_address=self.address,
            )
            summary.update({k: v for k, v in self.agent.status_extras().items() if k != "phase"})
            if completed:
                returns = self._evaluate(c.eval_episodes)
                summary.update(
                    final_eval_return_mean=float(np.mean(returns)),
                    final_eval_episodes=len(returns),
                    final_eval_returns=returns,
                )
            else:
                summary.update(final_eval_return_mean=None, final_eval_episodes=0)
            path = self._save()
            if completed and self.algo in ("dqn", "qdagger"):  # the run directory becomes a teacher
                summary["replay_checkpoint_dir"] = self._checkpoint_replay()
            last = self._log_metrics(writer, metrics_file, last)
            self._refresh_replay_status()
            st = self.status_dict()
            summary.update(
                env_steps=st["env_steps"],
                learner_steps=st["learner_steps"],
                weights_version=st["weights_version"],
                consumed_env_steps=st["consumed_env_steps"],
                dropped_env_steps=st["dropped_env_steps"],
                replay=st["replay"],
                wall_seconds=self._wall_seconds(time.time()),
                checkpoint=path,
                config=json.loads(c.to_json()),
            )
            with open(os.path.join(self.logdir, "summary.json"), "w") as f:
                json.dump(summary, f, indent=2)
            with self.lock:
                self.phase = "done"
            print(f"rlfleet learner: {'finished' if completed else 'stopped'}; checkpoint {path}", flush=True)
            if completed and self.linger_s:
                self.stop_event.wait(self.linger_s)  # let actors see stop=True and status be read
            return summary
        finally:
            self.stop_event.set()
            with self.weights_cond:
                self.weights_cond.notify_all()
            self.health.enter_graceful_shutdown()
            self.server.stop(grace=1.0).wait()
            status_thread.join(timeout=10)  # no Reverb call may be in flight when the interpreter exits
            metrics_file.close()
            writer.close()


def _peer_ip(peer: str) -> str:
    """The IP address in a gRPC peer string ("ipv4:10.0.0.2:5432" or "ipv6:[::1]:5432")."""
    kind, _, rest = peer.partition(":")
    host = rest.rsplit(":", 1)[0] if kind in ("ipv4", "ipv6") else peer
    return host.strip("[]")


def _progress_path(checkpoint: str) -> str:
    return checkpoint + PROGRESS_SUFFIX


def _write_progress(checkpoint: str, progress: dict) -> None:
    """Writes `progress` beside `checkpoint` (see `_read_progress`)."""
    os.makedirs(os.path.dirname(checkpoint), exist_ok=True)  # before the first checkpoint makes it
    tmp = _progress_path(checkpoint) + ".tmp"
    with open(tmp, "w") as f:
        json.dump(progress, f)
    os.replace(tmp, _progress_path(checkpoint))


def _read_progress(checkpoint: str | None) -> dict:
    """What `_write_progress` left beside `checkpoint`: {"next_actor_id": int, "wall_seconds": float (training
    time of the run so far, all processes), "actor_env_steps": {actor_id (int): that actor's cumulative env
    steps}}; ids from 0 and no time for a new run (None) and for checkpoints written before it existed."""
    if checkpoint is None:
        return dict(next_actor_id=0, wall_seconds=0.0, actor_env_steps={})
    try:
        with open(_progress_path(checkpoint)) as f:
            p = json.load(f)
    except FileNotFoundError:
        return _read_progress(None)
    return dict(
        next_actor_id=int(p["next_actor_id"]),
        wall_seconds=float(p["wall_seconds"]),
        actor_env_steps={int(k): int(v) for k, v in p["actor_env_steps"].items()},
    )


def make_agent(
    algo: str,
    spec,
    config,
    seed: int,
    teacher: str | None = None,
    teacher_replay: str | None = None,
    total_steps: int = 0,
) -> Agent:
    """The algorithm object for `algo` ("ppo", "dqn" or "qdagger"; QDagger loads `teacher`).

    `total_steps` is the run's env-step budget (0: none), for schedules that end with the run.

    Raises:
        TeacherError: QDagger's `teacher` is not a usable teacher for `spec`.
    """
    if algo == "ppo":
        return PPOAgent(spec, config, seed, total_steps)
    if algo == "dqn":
        from rlfleet.learner.dqn import DQNAgent

        return DQNAgent(spec, config, seed, total_steps)
    from rlfleet.learner.qdagger import QDaggerAgent
    from rlfleet.learner.teacher import load_teacher

    return QDaggerAgent(spec, config, seed, load_teacher(teacher, spec), teacher_replay)
