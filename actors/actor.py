"""The actor process: batched envs, one policy call per batch step, Reverb writing.

An actor needs only the learner's address: it registers, receives the run
configuration (algorithm, env, replay address, table, envs per actor, unroll
length, network spec), subscribes to weights on a background thread (new
versions are swapped in between steps, collection never pauses for them),
heartbeats its env steps and finished episodes, and runs the collection loop (`rlfleet.actors.adders.collect`)
with the algorithm's behaviour policy and replay writer (`AlgorithmBuilder.behaviour` and `adder`; the built-in
ones are in `rlfleet.algorithms.<name>.items`; they get an `rlfleet.actors.writers.ActorContext`), which steps
the batched env and writes into Reverb.
"""

from __future__ import annotations

import errno
import socket
import threading
import time
import typing

import grpc
import numpy as np

from rlfleet import algorithms
from rlfleet.actors import adders, replay_client
from rlfleet.actors.backend_choice import choose_backend
from rlfleet.actors.heartbeats import HEARTBEAT_S, HeartbeatStream
from rlfleet.actors.replay_link import connection_died_silently
from rlfleet.actors.writers import ActorContext
from rlfleet.algorithms.base import CreditLimit
from rlfleet.common.limits import open_files_problem, too_many_open_files
from rlfleet.common.logs import logger, set_role
from rlfleet.common.stopping import on_stop_signals
from rlfleet.envs import ENV_TIMEOUT_S
from rlfleet.envs.core import (
    OPEN_FILES_PER_ENV,
    env_identity,
    env_seeds,
    make_batched_env,
    policy_observations,
    resolve_backend,
)
from rlfleet.envs.watch import EnvHang, EnvWatch, watched
from rlfleet.proto import arrays as proto_arrays
from rlfleet.proto import rlfleet_pb2, rlfleet_pb2_grpc
from rlfleet.proto.security import ClientSecurity, channel, tls_problem

log = logger("actor")

# Heartbeats in a row that were sent but got no reply (each waits 5 s) before the actor replaces its channel:
# a connection that died silently is left within about 12 s (`Actor._reconnect`).
UNANSWERED_BEATS_BEFORE_RECONNECT = 2
# Seconds a writer may wait for its items to be confirmed before the actor asks whether its connection to the
# replay server died silently (`replay_link.connection_died_silently`), and how many answers in a row, a second
# apart, must say so.
REPLAY_STALL_S = 10.0
REPLAY_STALL_PROBES = 2

# After the learner says the run is over, an actor waits (its envs closed) until the learner's status says
# finished (final evaluation done, summary.json written) and lists no other actor (they have left too), or the
# learner is gone, at most this long (seconds): under docker-compose --exit-code-from learner, the first
# container to exit stops the others, which must not cut the final evaluation or another actor's leaving. An
# actor that stopped without leaving stays listed until the learner's --actor-timeout drops it, and the learner
# exits at the end of its --linger: either ends the wait.
RUN_END_WAIT_S = 3600.0
RUN_END_POLL_S = 2.0
RUN_END_UNREACHABLE_POLLS = 3  # status calls in a row that find no learner: it has exited
# Codes after which the weight stream reconnects (learner restarting, network hiccup); others stop the actor.
RETRYABLE = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.INTERNAL,
)


# The exit status of an actor stopped (SIGTERM/SIGINT) before its run ended: a supervisor (a Kubernetes Job) starts
# another; one whose run ended exits 0, one that cannot run 2.
EXIT_STOPPED = 3


class ActorError(RuntimeError):
    """An actor setup problem with a message that says how to fix it."""


class ReplayLost(Exception):
    """The replay server went away and came back (a restart), or the connection to it died silently: the open
    writers are dead; the message, if any, says which. `Actor.wait_written`
    raises it; the collection loop (`rlfleet.actors.adders.collect`) lets it through, and the actor
    opens new writers and resets its envs."""


class Policy(typing.NamedTuple):
    """A published behaviour policy: its policy version, its weights ({name: numpy array}, the learner's
    `Agent.export_weights()`) and its exploration (the `Exploration` message: `.epsilon`)."""

    version: int
    arrays: dict
    exploration: rlfleet_pb2.Exploration


class _Collection(typing.NamedTuple):
    """What the learner's latest weights message says of collection: its policy version, the items each actor
    writes with it (`Weights.items_per_actor`; 0: no limit) and the credit limit (`CreditLimit`)."""

    policy_version: int
    items_per_actor: int
    credit: CreditLimit


class _WeightsSubscriber(threading.Thread):
    """Keeps the latest `Policy` from the learner's StreamWeights RPC; reconnects with backoff.

    `stub_of()` gives the `LearnerStub` to stream from, asked again at every reconnect (the actor replaces its
    channel when a connection died silently: `Actor._reconnect`)."""

    def __init__(self, stub_of, actor_id: int, stop: threading.Event):
        super().__init__(daemon=True, name="weights")
        self.stub_of, self.actor_id, self.stop = stub_of, actor_id, stop
        self.latest: Policy | None = None
        self._collection = _Collection(-1, 0, CreditLimit())
        self.serial = 0  # weights messages received (a restarted learner may send a version again)
        self.resends = 0  # weights messages whose version was not newer than the latest (a restarted learner's)
        self._arrived = threading.Condition()
        self.error: str | None = None  # a failure that retrying cannot fix
        self.ready = threading.Event()

    def run(self):
        backoff = 0.5
        while not self.stop.is_set():
            try:
                # From the version acted with, not the one after: a learner restarted from a checkpoint of that
                # version sends it again, which ends a synchronous actor's wait for the next one.
                first = self.latest[0] if self.latest else 0
                for msg in self.stub_of().StreamWeights(
                    rlfleet_pb2.StreamWeightsRequest(actor_id=self.actor_id, min_policy_version=first)
                ):
                    version, arrays = proto_arrays.from_proto(msg)
                    # NaN only: an inf shows in the policy's outputs (`check_policy_output`).
                    bad = sorted(k for k, a in arrays.items() if a.dtype.kind == "f" and np.isnan(a).any())
                    if bad:  # never acted on: the learner diverged (a learner of this version checks first)
                        self.error = (
                            f"the learner published policy version {version} with NaN weights "
                            f"({', '.join(bad[:5])}): the learner's training diverged, not this actor's env; "
                            "nothing was collected with it. See the learner's log and status."
                        )
                        self.stop.set()
                        return
                    self.receive(
                        Policy(version, arrays, msg.exploration),
                        int(msg.items_per_actor),
                        CreditLimit(float(msg.item_share), int(msg.max_policy_lag)),
                    )
                    self.ready.set()
                    backoff = 0.5
                    if self.stop.is_set():
                        return
            except grpc.RpcError as e:
                if e.code() not in RETRYABLE:
                    self.error = f"the learner's weight stream failed ({e.code().name}: {e.details()})"
                    self.stop.set()
                    return
                log.warning("weights stream interrupted (%s); retrying in %.1fs", e.code(), backoff)
            except ValueError as e:  # a channel the actor closed under the call (`Actor._reconnect`): the next one
                log.warning("weights stream interrupted (%s); retrying in %.1fs", e, backoff)
            self.stop.wait(backoff)
            backoff = min(backoff * 2, 10.0)

    def receive(self, policy: Policy, items_per_actor: int, credit: CreditLimit | None = None) -> None:
        """Makes `policy` the latest, with the learner's `Weights.items_per_actor` and credit limit for it (None:
        no limit), and wakes `wait_next`."""
        with self._arrived:
            self._collection = _Collection(policy.version, items_per_actor, credit or CreditLimit())
            if self.latest is not None and policy.version <= self.latest.version:
                self.resends += 1
            self.latest = policy
            self.serial += 1
            self._arrived.notify_all()

    def items_per_actor(self, version: int) -> int:
        """The replay items this actor may write with policy `version` before it waits for a newer one
        (`Weights.items_per_actor`: the learner's synchronous mode); 0: no limit."""
        known = self._collection
        return known.items_per_actor if known.policy_version == version else 0

    def item_credit(self) -> CreditLimit:
        """The credit limit of the latest weights message: asynchronous collection's limit on running ahead
        (`rlfleet.actors.writers.ItemCredit`); `CreditLimit()`: no limit."""
        return self._collection.credit

    def wait_next(self, serial: int, stop: threading.Event, check=None) -> bool:
        """Blocks until a weights message after the `serial`-th has arrived: a newer policy version, or the
        same one sent again by a restarted learner. False if `stop` was set first. `check()`, if given, is
        called every 50 ms while waiting (it may raise, e.g. `ReplayLost`)."""
        with self._arrived:
            while self.serial == serial:
                if stop.is_set():
                    return False
                if check is not None:
                    check()
                self._arrived.wait(0.05)
        return True


class Actor:
    """One actor process.

    Args:
        learner_address: host:port of the learner service.
        num_envs: 0 to take the run's envs per actor; otherwise must equal it.
        replay_address: override the replay address the learner announces
            (an actor on another machine may reach Reverb under another name).
        backend: override the run's env backend (`rlfleet.envs.core.BACKENDS`, or "auto": chosen by
            measurement, `rlfleet.actors.backend_choice`).
        connect_timeout_s: how long to wait for the learner before failing.
        security: TLS and token for the learner connection (`rlfleet.proto.security.ClientSecurity`).
    Raises:
        ActorError: learner unreachable, or registration refused (wrong token, other envs per actor).
        SecurityError: unreadable TLS files.

    Faults: the weight stream and heartbeats reconnect with backoff when the
    learner restarts (the restarted learner re-admits the actor by its id); when
    the replay server restarts, the actor opens new writers and resets its envs
    (episodes in progress are dropped, never reported as complete).
    """

    def __init__(
        self,
        learner_address: str,
        num_envs: int = 0,
        replay_address: str | None = None,
        backend: str | None = None,
        connect_timeout_s: float = 30.0,
        security: ClientSecurity | None = None,
    ):
        self.security = security
        self.channel = channel(learner_address, security)
        self.stub = rlfleet_pb2_grpc.LearnerStub(self.channel)
        self.host = socket.gethostname()
        resp = self._register(learner_address, num_envs, connect_timeout_s)
        self.actor_id, self.config = resp.actor_id, resp.config
        self.learner_identity = dict(resp.identity)  # the learner machine's env and versions ({}: not said)
        set_role(f"actor-{self.actor_id}")  # the learner's number for it, in every line from here on
        try:
            self.builder = algorithms.get(self.config.algo)
        except (ValueError, ImportError) as e:
            raise ActorError(
                f"the learner runs algorithm {self.config.algo!r}, which this machine cannot run ({e}). Install "
                "the same rlfleet and algorithm plugins as the learner machine, with the same $RLFLEET_PLUGINS."
            ) from None
        self.replay_address = replay_address or self.config.replay_address
        requested = backend or self.config.env_backend or "auto"
        self.backend = resolve_backend(self.config.env_id, requested)
        if requested == "auto":  # Atari: "ale"; else chosen by measurement when the envs are built (`_open_envs`)
            atari = self.backend == "ale"
            self.backend_reason = "auto chose ale: Atari ids step on ale-py's C++ vector env" if atari else ""
        else:
            self.backend_reason = f"--env-backend {requested} ({'this actor' if backend else 'the run'})"
        self.net = self.config.network  # rlfleet_pb2.NetworkSpec
        self.obs_shape = tuple(self.net.observation_shape)
        self.frame_stack = self.net.frame_stack or 1
        self.stop = threading.Event()
        self.told_to_stop = threading.Event()  # by the learner: the run is over
        self.terminated = threading.Event()  # by SIGTERM/SIGINT
        self.env_steps = 0
        self.policy_version = -1
        self.pending_returns: list[float] = []
        self.pending_lengths: list[int] = []
        self.lock = threading.Lock()
        self.replay_epoch = 0  # +1 each time the replay server comes back after being unreachable
        self._restarts = 0
        self.learner_address = learner_address
        self._heartbeats_failed = 0  # in a row
        self._heartbeats_unanswered = 0  # in a row: sent, but no reply in time (not refused)
        self.heartbeats = HeartbeatStream(self.stub)

    def _register(self, learner_address: str, num_envs: int, connect_timeout_s: float):
        """RegisterActor, waiting up to `connect_timeout_s` for the learner; returns its reply.

        Raises:
            ActorError: no connection in time, a refused token or TLS handshake, or a refused registration, each
                with what to check.
        """
        deadline = time.monotonic() + connect_timeout_s
        while True:
            try:
                return self.stub.RegisterActor(
                    rlfleet_pb2.RegisterActorRequest(host=self.host, num_envs=num_envs),
                    wait_for_ready=True,
                    timeout=max(1.0, deadline - time.monotonic()),
                )
            except grpc.RpcError as e:
                # A learner that stopped while it was still starting (ABORTED) may be restarted by its supervisor.
                if e.code() != grpc.StatusCode.ABORTED or time.monotonic() + 2 > deadline:
                    self._refused(e, learner_address, connect_timeout_s)
                log.warning("learner %s: %s; registering again", learner_address, e.details())
                time.sleep(2)

    def _refused(self, e: grpc.RpcError, learner_address: str, connect_timeout_s: float):
        """Raises the ActorError that a failed RegisterActor call `e` means (with TLS, a handshake that fails
        names why: the certificate's host name, its expiry, its CA)."""
        if e.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE):
            problem = tls_problem(learner_address, self.security)
            if problem:
                raise ActorError(f"cannot connect to the learner {learner_address}: {problem}.") from None
        if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            raise ActorError(
                f"no connection to the learner {learner_address} after {connect_timeout_s:.0f}s; "
                "check the address (rlfleet up prints it) and that the learner runs. If it serves "
                "TLS, pass --tls-ca, and --tls-cert/--tls-key when it requires client certificates "
                "(the learner's log names the handshake error); if it serves plaintext, pass no "
                "TLS options."
            ) from None
        if e.code() == grpc.StatusCode.UNAUTHENTICATED:
            raise ActorError(f"learner {learner_address} refused this actor: {e.details()}") from None
        if e.code() == grpc.StatusCode.UNAVAILABLE:
            raise ActorError(
                f"cannot connect to the learner {learner_address}: {e.details()}; with TLS, "
                "pass --tls-ca (and --tls-cert/--tls-key when it asks for client "
                "certificates)."
            ) from None
        raise ActorError(f"learner refused registration: {e.details()}") from None

    def _replay_reachable(self) -> bool:
        """Whether the replay server's port accepts a TCP connection (within 2 s). A refused connection means the
        process is gone; a busy server (e.g. one writing a checkpoint) still accepts."""
        host, _, port = self.replay_address.rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=2).close()
            return True
        except OSError:
            return False

    def _wait_for_replay(self) -> bool:
        """Waits until the replay server accepts connections; False when the actor stops first (SIGTERM, the
        learner's stop). Opening Reverb writers to a server that is down blocks inside Reverb, where no signal
        handler runs, so the actor only opens them once the server answers."""
        while not self._replay_reachable():
            if self.stop.wait(1.0):
                return False
        return True

    def _watch_replay(self):
        """Counts the replay server's comebacks in `replay_epoch`: every second it checks the replay port
        (`_replay_reachable`), so a busy server is not mistaken for a restart."""
        down = False
        while not self.stop.wait(1.0):
            if self._replay_reachable():
                if down:
                    down = False
                    self.replay_epoch += 1
            else:
                if not down:
                    log.warning("replay server %s unreachable; waiting for it", self.replay_address)
                down = True

    def _heartbeat_loop(self):
        while not self.stop.wait(HEARTBEAT_S):
            self._heartbeat()

    def _heartbeat(self, leaving: bool = False):
        with self.lock:
            returns, lengths = self.pending_returns, self.pending_lengths
            self.pending_returns, self.pending_lengths = [], []
            backend, reason = ("" if self.backend == "auto" else self.backend), self.backend_reason
        try:
            resp = self.heartbeats.beat(
                rlfleet_pb2.HeartbeatRequest(
                    actor_id=self.actor_id,
                    env_steps=self.env_steps,
                    policy_version=self.policy_version,
                    episode_returns=returns,
                    episode_lengths=lengths,
                    num_envs=self.config.num_envs,
                    host=self.host,
                    leaving=leaving,
                    env_backend=backend,
                    env_backend_reason=reason,
                ),
                timeout_s=5,
            )
            self._heartbeats_unanswered = 0
            if self._heartbeats_failed:
                log.warning(
                    "learner %s is back after %d failed heartbeats; rejoined",
                    self.learner_address,
                    self._heartbeats_failed,
                )
                self._heartbeats_failed = 0
            if resp.stop:
                self.told_to_stop.set()
                self.stop.set()
        except grpc.RpcError as e:
            with self.lock:  # keep the returns for the next heartbeat
                self.pending_returns = returns + self.pending_returns
                self.pending_lengths = lengths + self.pending_lengths
            self._heartbeats_failed += 1
            log.warning("heartbeat failed: %s", e.code())
            unanswered = e.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED)
            self._heartbeats_unanswered = self._heartbeats_unanswered + 1 if unanswered else 0
            if self._heartbeats_unanswered >= UNANSWERED_BEATS_BEFORE_RECONNECT:
                self._reconnect()
                self._heartbeats_unanswered = 0

    def _reconnect(self) -> None:
        """Replaces the channel to the learner by a new one (a new connection), for a connection that died
        without a FIN or RST (a NAT or firewall that dropped its state): gRPC's keepalive pings are not sent
        while calls keep writing on it, so every call would wait on the dead connection. Closing the old
        channel ends the weight stream on it, which the weights thread opens again on the new one."""
        log.warning(
            "%d heartbeats in a row got no reply; connecting to the learner %s anew",
            self._heartbeats_unanswered,
            self.learner_address,
        )
        old = self.channel
        try:
            self.channel = channel(self.learner_address, self.security)
        except (ValueError, OSError) as e:  # the settings worked at start; keep the channel there is
            log.warning("cannot open a new channel to the learner (%s); keeping the old one", e)
            return
        self.stub = rlfleet_pb2_grpc.LearnerStub(self.channel)
        self.heartbeats.close()
        self.heartbeats = HeartbeatStream(self.stub)
        old.close()

    def check_replay(self, epoch: int) -> None:
        """Raises ReplayLost when the replay server restarted since `epoch` (its open writers are dead)."""
        if self.replay_epoch != epoch:
            raise ReplayLost()

    def wait_written(self, writer, epoch: int, in_flight: int = 1) -> bool:
        """Blocks until at most `in_flight` items are pending (rate-limiter backpressure); False if stopping.

        Raises:
            ReplayLost: the replay server restarted since `epoch` (a writer never recovers from that), or the
                writer's connection died silently (`_replay_connection_dead`).
        """
        stalled_since = time.monotonic()
        while True:
            if self.replay_epoch != epoch:
                raise ReplayLost()
            try:
                writer.flush(block_until_num_items=in_flight, timeout_ms=500)
                return True
            except replay_client.deadline_exceeded_errors():  # the writer's class, whichever Reverb made it
                if self.stop.is_set():
                    return False
            if time.monotonic() - stalled_since >= REPLAY_STALL_S:
                if self._replay_connection_dead():
                    raise ReplayLost(
                        f"no item confirmed for {REPLAY_STALL_S:g} s and the "
                        f"connection to {self.replay_address} gets no answer while a new one does: it died "
                        "silently; new writers on a new connection, envs reset (the episodes in progress are "
                        "dropped)"
                    )
                stalled_since = time.monotonic()

    def _replay_connection_dead(self) -> bool:
        """True when `replay_link.connection_died_silently` says so `REPLAY_STALL_PROBES` times in a row, a
        second apart: the writers' connection gets no answer while a new one does. A rate limiter holding the
        writes back, a slow link or a server that is down (`_watch_replay` sees its restart) is no reason."""
        for probe in range(REPLAY_STALL_PROBES):
            if probe and self.stop.wait(1.0):
                return False
            if not connection_died_silently(self.replay_address):
                return False
        return True

    def _open_envs(self):
        """The actor's batch of envs on its backend; "auto" measures the candidates first and says which it
        chose and why (`rlfleet.actors.backend_choice.choose_backend`)."""
        cfg = self.config
        needed = OPEN_FILES_PER_ENV.get(self.backend, 0) * cfg.num_envs
        problem = open_files_problem(needed, f"{cfg.num_envs} envs on the {self.backend} backend") if needed else None
        if problem:
            raise ActorError(problem)
        try:
            return self._make_envs()
        except OSError as e:
            if e.errno not in (errno.EMFILE, errno.ENFILE):
                raise
            raise ActorError(too_many_open_files(f"{cfg.num_envs} envs on the {self.backend} backend")) from None

    def _make_envs(self):
        cfg = self.config
        if self.backend != "auto":
            venv = make_batched_env(cfg.env_id, cfg.num_envs, self.backend)
            if self.backend == "workers":  # how many processes the cores allowed: the largest even share
                n = venv.num_workers
                self.backend_reason += f": {n} process{'es' if n > 1 else ''} x {cfg.num_envs // n} envs"
        else:
            venv, choice = choose_backend(cfg.env_id, cfg.num_envs, stop=self.stop)
            with self.lock:
                self.backend, self.backend_reason = choice.backend, f"auto chose {choice.reason}"
        log.info("env backend %s", self.backend_reason)
        return venv

    def run(self) -> int:
        """Collects until the learner says stop or SIGTERM/SIGINT; returns env steps taken."""
        cfg = self.config
        on_stop_signals(self.terminated.set, self.stop.set)
        replay_client.load()  # before the threads below: see `replay_client.load`
        heartbeats = threading.Thread(target=self._heartbeat_loop, daemon=True, name="heartbeat")
        venv = None
        timeout_s = cfg.env_timeout_s if cfg.HasField("env_timeout_s") else ENV_TIMEOUT_S
        watch = EnvWatch(cfg.env_id, timeout_s, lambda: f"{cfg.num_envs} envs, seeds from {self._env_seed()}")
        try:
            heartbeats.start()  # before the envs: `auto` measuring slow envs must not time out of the status list
            self._check_identity()
            venv = self._open_watched_envs(watch)  # an env that fails still leaves the status list at once (below)
            self._check_spec(venv)
            weights = _WeightsSubscriber(lambda: self.stub, self.actor_id, self.stop)
            weights.start()
            threading.Thread(target=self._watch_replay, daemon=True, name="replay-watch").start()
            while not weights.ready.wait(0.5):
                if weights.error:
                    raise ActorError(weights.error)
                if self.stop.is_set():
                    return 0
            log.info(
                "%d x %s (%s) writing to replay at %s", cfg.num_envs, cfg.env_id, self.backend, self.replay_address
            )
            self._collect(venv, weights)
            if weights.error:
                raise ActorError(weights.error)
        finally:
            self.stop.set()
            self._close_envs(venv, watch)
            self._leave(heartbeats)
        return self.env_steps

    def _open_watched_envs(self, watch: EnvWatch):
        """Starts `watch` (left by `_close_envs`) and makes the envs under it, their construction included (`auto`
        steps them too, to measure the backends); returns them with their calls watched."""
        watch.__enter__()
        watch.begin("envs' construction")
        try:
            venv = self._open_envs()
        finally:
            watch.end()
        return watched(venv, watch)

    def _close_envs(self, venv, watch: EnvWatch) -> None:
        """Closes the envs (None: none were made) and leaves `watch`; a close that hangs is reported and given
        up."""
        try:
            if venv is not None:
                venv.close()
        except EnvHang as e:
            log.error("%s; the envs were left as they are.", e)
        finally:
            watch.__exit__(None, None, None)

    def _leave(self, heartbeats: threading.Thread) -> None:
        """The actor's last heartbeat (its final steps and episodes: status drops it at once), then, when the
        learner told it to stop, the wait for the run's end."""
        if heartbeats.is_alive():  # none may arrive after the last one and re-admit this actor
            heartbeats.join(timeout=10)
        failed = self._heartbeats_failed
        self._heartbeat(leaving=True)
        if self._heartbeats_failed > failed:  # once more: until it leaves, the run's end waits for it
            time.sleep(HEARTBEAT_S)  # a learner restarting or a lost connection: give it a moment
            self._heartbeat(leaving=True)
        self.heartbeats.close()
        log.info("stopped after %d env steps", self.env_steps)
        if self.told_to_stop.is_set():
            self._wait_for_run_end()

    def _wait_for_run_end(self) -> None:
        """Waits until the learner's status says the run is finished (its final evaluation and summary.json
        done) and lists no actor but this one (every other actor left it too, or timed out of it), or the learner
        cannot be reached (`RUN_END_UNREACHABLE_POLLS` status calls in a row: it exited), SIGTERM/SIGINT, or
        `RUN_END_WAIT_S` seconds. This actor holds no envs meanwhile."""
        deadline = time.monotonic() + RUN_END_WAIT_S
        unreachable = 0  # status calls in a row that found no learner
        finished = False
        while time.monotonic() < deadline and not self.terminated.wait(RUN_END_POLL_S):
            try:
                st = self.stub.GetStatus(rlfleet_pb2.GetStatusRequest(), timeout=10)
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED and not finished:
                    continue  # a busy learner (its final evaluation, many actors): ask again
                unreachable += 1
                if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    return  # it refuses: nothing to wait for
                if unreachable >= RUN_END_UNREACHABLE_POLLS:
                    return  # the learner is gone
                continue
            unreachable = 0
            if st.finished:
                if not any(a.actor_id != self.actor_id for a in st.actors):
                    return
                finished = True

    def _check_identity(self) -> None:
        """Raises ActorError when this machine runs the env otherwise than the learner's (`env_identity`: rlfleet's
        or gymnasium's version, the env package's version, the time limit), before any env is made."""
        here = env_identity(self.config.env_id)
        there = self.learner_identity
        keys = sorted(here.keys() & there.keys())
        diff = [f"{k}: {here[k]} here, {there[k]} at the learner" for k in keys if here[k] != there[k]]
        if diff:
            raise ActorError(
                f"this machine runs {self.config.env_id} otherwise than the learner's: {'; '.join(diff)}. Its "
                "steps would not be the run's env; install the same versions (pip install the learner machine's "
                "rlfleet, gymnasium and env package) and start the actor again. Nothing was written to replay."
            )

    def _check_spec(self, venv) -> None:
        """Raises ActorError when this machine's env differs from the learner's (observation shape,
        number of discrete actions or action dimension), before anything is written."""
        cfg, net = self.config, self.net
        space = venv.single_action_space
        here = dict(observation_shape=tuple(venv.single_observation_space.shape))
        there = dict(observation_shape=self.obs_shape)
        if net.num_actions:
            here["actions"], there["actions"] = int(getattr(space, "n", -1)), net.num_actions
        if net.action_dim:
            here["action_dim"], there["action_dim"] = int(np.prod(space.shape or (0,))), net.action_dim
        diff = [f"{k} {here[k]} here, {there[k]} at the learner" for k in here if here[k] != there[k]]
        if diff:
            raise ActorError(
                f"env {cfg.env_id} on this machine does not match the learner's: {'; '.join(diff)}. "
                "Install the same gymnasium/mujoco/ale-py versions as the learner machine; "
                "nothing was written to replay."
            )

    def _collect(self, venv, weights) -> None:
        """Runs the collection loop until the actor stops, with new writers (and reset envs) after each replay
        restart. Raises ActorError for an exception the env raised in its reset or step."""
        while not self.stop.is_set():
            if not self._wait_for_replay():
                return
            try:
                adders.collect(self.builder, ActorContext(self), venv, weights, self.replay_epoch)
                return
            except ReplayLost as e:
                self._restarts += 1
                log.warning(
                    "%s",
                    str(e)
                    or f"replay server {self.replay_address} is back; new writers, envs reset (the episodes "
                    "in progress are dropped)",
                )
            except adders.EnvStepError as e:  # a user's env that raises
                raise self._collection_error(e.__cause__) from e

    def _collection_error(self, e: Exception) -> ActorError:
        """The ActorError of an exception the collection raised (an env's, most often), with the env id and its
        seeds; the traceback goes to the log."""
        cfg = self.config
        seed = self._env_seed()
        log.error("collection stopped by %s: %s. Its traceback:", type(e).__name__, e, exc_info=e)
        if isinstance(e, EnvHang):  # its message names the env, its seeds and the limit; where it hung is logged
            return ActorError(
                f"{e}: this actor stopped after {self.env_steps} env steps; where it hung is in its log. What it "
                "collected before is in the replay."
            )
        return ActorError(
            f"{type(e).__name__}: {e}, raised while this actor stepped {cfg.num_envs} x {cfg.env_id} (env seeds "
            f"from {seed}) after {self.env_steps} env steps; the traceback is in this actor's log. What it "
            "collected before is in the replay."
        )

    def _env_seed(self) -> int:
        """The env seed of the first of this actor's envs: the run's for it, another after each replay restart (a
        restart after a replay outage gets new episodes)."""
        return int(self.config.seed) + 7919 * self._restarts

    def start_episodes(self, venv):
        """Seeds the behaviour policy's RNG and resets the envs; returns (rng, first observations [B, ...])."""
        cfg = self.config
        self._episode_return = np.zeros(cfg.num_envs, np.float64)
        self._episode_length = np.zeros(cfg.num_envs, np.int64)
        seed = self._env_seed()
        try:
            obs, _ = venv.reset(seed=env_seeds(seed, cfg.num_envs))
        except Exception as e:  # a user's env that raises
            raise self._collection_error(e) from e
        obs = policy_observations(obs)  # as the policy takes them (a float64 beyond float32's range: not finite)
        self.check_finite(obs, where="in its reset")  # before the policy sees it: the env's fault, said so
        return np.random.default_rng(seed), obs

    def check_finite(self, obs: np.ndarray, reward: np.ndarray | None = None, where: str = "") -> None:
        """Raises ActorError when the env returned a NaN/inf observation or reward (None: not checked), before
        it is written: replay and the learner only ever see finite data (what was collected before stays).
        `where`: when the env returned them, for the message (e.g. "in its reset")."""
        bad_obs = (
            ~np.isfinite(obs).reshape(len(obs), -1).all(axis=1) if obs.dtype.kind == "f" else np.zeros(len(obs), bool)
        )
        bad = bad_obs if reward is None else bad_obs | ~np.isfinite(reward)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            what = "observation" if bad_obs[i] else f"reward ({reward[i]})"
            raise ActorError(
                f"env {self.config.env_id} (env {i} of this actor) returned a non-finite {what}"
                f"{' ' + where if where else ''} after {self.env_steps} env steps; the actor stopped without writing "
                "it. Fix the "
                "env (or its wrappers); the replay and the learner keep everything collected so far."
            )

    def check_policy_output(self, version: int, *values: np.ndarray) -> None:
        """Raises ActorError when the behaviour policy of `version` gave a NaN/inf output (`values`: actions,
        log-probs, Q-values) for finite observations: the learner's weights are at fault, not the env;
        nothing of that step is written."""
        if not all(np.isfinite(v).all() for v in values):
            raise ActorError(
                f"the policy of version {version} from the learner gave non-finite outputs for finite "
                f"observations after {self.env_steps} env steps: the learner's training diverged (its weights "
                "overflow), not this actor's env; the actor stopped without writing the step. See the learner's "
                "log and status; lower its learning rate."
            )

    @property
    def episode_steps(self) -> np.ndarray:
        """int64 [B]: the steps each env has taken in its current episode (0 before its first; read-only)."""
        view = self._episode_length.view()
        view.flags.writeable = False
        return view

    def count_steps(self, reward, done) -> None:
        """Counts one batch step; queues the returns of finished episodes for the next heartbeat."""
        self._episode_return += reward
        self._episode_length += 1
        self.env_steps += len(done)
        if done.any():
            with self.lock:
                self.pending_returns.extend(self._episode_return[done].tolist())
                self.pending_lengths.extend(self._episode_length[done].tolist())
            self._episode_return[done] = 0.0
            self._episode_length[done] = 0
