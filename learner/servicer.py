"""The learner's gRPC face: the `rlfleet.Learner` service (proto/rlfleet.proto) on an asyncio gRPC server.

`LearnerServer` runs a `grpc.aio` server on an event loop of its own thread, so no call holds a worker thread
while it waits: a weight stream is a coroutine parked on the next policy version, and registration,
heartbeats, status and the health check are answered promptly however many actors hold streams (a thread
pool of fixed size would be used up by the streams). The handlers only translate between
messages and the learner (`rlfleet.learner.service.Learner`), whose methods are short and lock-guarded.
`bind_learner_server` binds the server to the run's address, or says why it cannot.

Weights fan-out: `WeightsBroadcast.publish` serializes each policy version once; every stream sends those
same bytes (the StreamWeights handler's response serializer passes bytes through).
"""

from __future__ import annotations

import asyncio
import hmac
import threading
import time

import grpc
from grpc_health.v1 import _async as health_aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rlfleet.common.addresses import bind_problem, host_port
from rlfleet.learner.errors import LearnerError
from rlfleet.proto import rlfleet_pb2
from rlfleet.proto.arrays import GRPC_OPTIONS
from rlfleet.proto.security import METADATA_KEY, PROTECTED_PREFIX, TOKEN_ENV, server_credentials

_SERVICE = "rlfleet.Learner"
# Weight messages being written to streams at once (the other streams wait their turn): at most MAX_WRITES,
# and no more than SEND_BUDGET_BYTES of them (9 Nature CNN messages of 6.7 MB).
MAX_WRITES = 32
SEND_BUDGET_BYTES = 64 * 2**20
WRITE_TIMEOUT_S = 30.0  # a weights write that takes longer ends its stream (the reader stopped reading)
# The details of the ABORTED status that ends the actors' calls held by a learner that stopped before it served.
NOT_STARTED = "the learner stopped before it served its actors (it was still starting)"
# HTTP/2 keepalive pings find connections to actors that vanished (a frozen host, a partition) and close them;
# the clients' own pings (`rlfleet.proto.security.CLIENT_KEEPALIVE_TIME_MS`, every 10 s) are permitted down to
# every 5 s, with or without calls, so that none is answered with GOAWAY too_many_pings.
KEEPALIVE_OPTIONS = [
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_ping_strikes", 0),
]


class WeightsBroadcast:
    """The latest `Weights` message, serialized once; streams (coroutines on the server's event loop) wait
    here for a newer policy version. `publish` and `close` may be called from any thread."""

    def __init__(self):
        self._lock = threading.Lock()
        self.latest: rlfleet_pb2.Weights | None = None
        self._latest_bytes = b""
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed: asyncio.Event | None = None

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Binds the broadcast to the event loop its streams run on (called on that loop)."""
        self._loop, self._changed = loop, asyncio.Event()
        self._slots: asyncio.Semaphore | None = None  # made at the first write, sized by the message

    def publish(self, msg: rlfleet_pb2.Weights) -> None:
        """Makes `msg` the version every stream sends next: stamps its `published_at` (Unix seconds) and
        serializes it, once for all streams."""
        msg.published_at = time.time()
        data = msg.SerializeToString()
        with self._lock:
            self.latest, self._latest_bytes = msg, data
        self._wake()

    def close(self) -> None:
        """Ends every stream (the learner stops)."""
        self._closed = True
        self._wake()

    def _wake(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            try:
                self._loop.call_soon_threadsafe(self._notify)
            except RuntimeError:  # the loop stopped meanwhile
                pass

    def _notify(self) -> None:
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    async def serve(self, min_policy_version: int, write) -> None:
        """Sends each newer version from `min_policy_version` on through `write` (an async function of the
        serialized bytes: the stream's `context.write`), until `close`. A caller that holds a newer version
        than the latest (a learner restarted from an older checkpoint) gets the latest at once.

        At most `MAX_WRITES` writes, and about `SEND_BUDGET_BYTES` bytes, are in flight over all streams; the
        other streams wait their turn (a FIFO semaphore wakes one at a time) and then send the newest version
        of that moment, not the one they woke for. A new version thus reaches N streams as a steady flow, not
        N callbacks queued at once on the event loop: a status call or heartbeat arriving meanwhile waits
        behind a few writes, and large weights (a Nature CNN's 6.7 MB) never pile up in memory.

        Raises:
            TimeoutError: one write took more than `WRITE_TIMEOUT_S` (a reader that stopped reading: a
                frozen or partitioned actor); its slot is freed for the others.
        """
        sent = min_policy_version - 1
        while not self._closed:
            changed = self._changed  # taken before the check: a publish after it sets this event
            with self._lock:
                latest = self.latest
            if latest is not None and sent > latest.policy_version:
                sent = -1
            if latest is None or latest.policy_version <= sent:
                await changed.wait()
                continue
            if self._slots is None:  # the message size is the same for every version of a run
                size = max(len(self._latest_bytes), 1)
                self._slots = asyncio.Semaphore(max(1, min(MAX_WRITES, SEND_BUDGET_BYTES // size)))
            async with self._slots:
                with self._lock:  # the newest version by now
                    latest, data = self.latest, self._latest_bytes
                async with asyncio.timeout(WRITE_TIMEOUT_S):  # no task per write, unlike wait_for
                    await write(data)
            sent = latest.policy_version


def peer_ip(peer: str) -> str:
    """The IP address in a gRPC peer string ("ipv4:10.0.0.2:5432" or "ipv6:[::1]:5432")."""
    kind, _, rest = peer.partition(":")
    host = rest.rsplit(":", 1)[0] if kind in ("ipv4", "ipv6") else peer
    return host.strip("[]")


class _Methods:
    """The `rlfleet.Learner` methods over `server.learner` (a `rlfleet.learner.service.Learner`). The actors'
    calls wait until the server is ready (`LearnerServer.start`); GetStatus answers at once, with the waiting
    status while no learner is attached."""

    def __init__(self, server: "LearnerServer"):
        self.server = server

    async def register_actor(self, request, context):
        learner = await self.server.ready_learner(context)
        envs = learner.config.envs_per_actor
        if request.num_envs and request.num_envs != envs:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"actor asked for {request.num_envs} envs but this run's replay items hold {envs} envs per "
                f"actor; start the actor without --num-envs or with --num-envs {envs}.",
            )
        address = peer_ip(context.peer())
        actor_id = learner.admit_actor(request.host or address, address)
        return rlfleet_pb2.RegisterActorResponse(
            actor_id=actor_id, config=learner.run_config(actor_id), identity=learner.env_identity
        )

    async def stream_weights(self, request, context):
        learner = await self.server.ready_learner(context)
        try:
            await learner.weights.serve(request.min_policy_version, context.write)
        except TimeoutError:  # the actor reconnects when it reads again (DEADLINE_EXCEEDED is retryable)
            await context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED, f"no weights message was read for {WRITE_TIMEOUT_S:.0f}s"
            )

    async def heartbeat(self, request, context):
        learner = await self.server.ready_learner(context)
        stop = learner.record_heartbeat(request, peer_ip(context.peer()))
        return rlfleet_pb2.HeartbeatResponse(stop=stop)

    async def heartbeats(self, request_iterator, context):
        learner = await self.server.ready_learner(context)
        address = peer_ip(context.peer())
        async for request in request_iterator:
            yield rlfleet_pb2.HeartbeatResponse(stop=learner.record_heartbeat(request, address))

    async def get_status(self, request, context):
        learner = self.server.learner
        return learner.status_proto() if learner is not None else self.server.waiting_status()


def _unary(fn, req, resp):
    return grpc.unary_unary_rpc_method_handler(
        fn, request_deserializer=req.FromString, response_serializer=resp.SerializeToString
    )


def _handlers(server: "LearnerServer") -> grpc.GenericRpcHandler:
    """The `rlfleet.Learner` service's handlers (`_Methods`) over `server`."""
    m = _Methods(server)
    return grpc.method_handlers_generic_handler(
        _SERVICE,
        {
            "RegisterActor": _unary(
                m.register_actor, rlfleet_pb2.RegisterActorRequest, rlfleet_pb2.RegisterActorResponse
            ),
            # The stream yields bytes serialized once per version by WeightsBroadcast.publish.
            "StreamWeights": grpc.unary_stream_rpc_method_handler(
                m.stream_weights,
                request_deserializer=rlfleet_pb2.StreamWeightsRequest.FromString,
                response_serializer=bytes,
            ),
            "Heartbeat": _unary(m.heartbeat, rlfleet_pb2.HeartbeatRequest, rlfleet_pb2.HeartbeatResponse),
            "Heartbeats": grpc.stream_stream_rpc_method_handler(
                m.heartbeats,
                request_deserializer=rlfleet_pb2.HeartbeatRequest.FromString,
                response_serializer=rlfleet_pb2.HeartbeatResponse.SerializeToString,
            ),
            "GetStatus": _unary(m.get_status, rlfleet_pb2.GetStatusRequest, rlfleet_pb2.Status),
        },
    )


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Refuses every `rlfleet.Learner` call whose metadata lacks `authorization: Bearer TOKEN`
    (UNAUTHENTICATED, before the handler runs); the health service is not checked."""

    def __init__(self, token: str):
        self.expected = f"Bearer {token}".encode()

        async def deny(request, context):
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "missing or wrong token: this learner requires the cluster's shared token; pass "
                f"--token or set {TOKEN_ENV} to the value the learner was started with.",
            )

        async def deny_stream(request, context):
            await deny(request, context)
            yield b""  # never reached: abort raises

        # One refusal of each kind (request streaming, response streaming): a handler reaches the caller only
        # when its kind is the method's.
        self._deny = {
            (False, False): grpc.unary_unary_rpc_method_handler(deny),
            (False, True): grpc.unary_stream_rpc_method_handler(deny_stream),
            (True, False): grpc.stream_unary_rpc_method_handler(deny),
            (True, True): grpc.stream_stream_rpc_method_handler(deny_stream),
        }

    async def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method
        if not method.startswith(PROTECTED_PREFIX):
            return await continuation(handler_call_details)
        got = dict(handler_call_details.invocation_metadata or ()).get(METADATA_KEY, "")
        handler = await continuation(handler_call_details)
        if handler is None or hmac.compare_digest(got.encode(), self.expected):
            return handler  # None: an unknown method (UNIMPLEMENTED)
        return self._deny[(handler.request_streaming, handler.response_streaming)]


class BindError(RuntimeError):
    """The server could not bind its address (port in use, or an address of no local interface)."""


class LearnerServer:
    """The learner's gRPC server (the `rlfleet.Learner` service and the gRPC health service) on an asyncio
    event loop in a daemon thread named "grpc". The port is bound on construction; `start` serves.

    A learner that is still starting serves early (`serve_waiting`): status answers with the phase it is in and
    what it waits for (its settings file, the replay server), the health service reports NOT_SERVING, and
    actors' calls wait, until `start`.

    Args:
        learner: a `rlfleet.learner.service.Learner` (admit_actor, run_config, record_heartbeat,
            status_proto, config.envs_per_actor, weights: a `WeightsBroadcast`), or None: one is attached
            later (`attach`).
        address: "host:port" to bind (port 0: any free port).
        options: gRPC channel arguments; SO_REUSEPORT is always off (a second server on a held port fails).
        credentials: TLS server credentials, or None for plaintext.
        token: when set, every `rlfleet.Learner` call must carry it (`TokenInterceptor`).
    Raises:
        BindError: the address cannot be bound.
    """

    def __init__(self, learner, address: str, options: list, credentials=None, token: str = ""):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="grpc")
        self._thread.start()
        self.learner = None
        self.waiting = ("starting", "")  # (phase, what it waits for) that status shows until a learner is attached
        self._start_time = time.monotonic()
        self._serving = False
        self._stopped = False
        try:
            self.port = self._run(self._create(address, options, credentials, token))
        except BaseException:
            self._shutdown_loop()
            raise
        if learner is not None:
            self.attach(learner)

    def _run(self, coro, timeout: float | None = 30.0):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _create(self, address, options, credentials, token) -> int:
        self._ready = asyncio.Event()
        self._server = grpc.aio.server(
            options=[*options, *KEEPALIVE_OPTIONS, ("grpc.so_reuseport", 0)],
            interceptors=[TokenInterceptor(token)] if token else None,
        )
        self._server.add_generic_rpc_handlers((_handlers(self),))
        self.health = health_aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        try:
            if credentials is not None:
                port = self._server.add_secure_port(address, credentials)
            else:
                port = self._server.add_insecure_port(address)
        except RuntimeError:
            port = 0
        if port == 0:
            raise BindError(address)
        return port

    def attach(self, learner) -> None:
        """Serves `learner`: status is its own from now on; its actors' calls still wait for `start`."""

        async def attach():
            learner.weights.attach(asyncio.get_running_loop())

        self._run(attach())
        self.learner = learner

    async def ready_learner(self, context):
        """The attached learner, once the server is ready (`start`): what the actors' calls wait for. A call
        that waited while the learner stopped before it served ends with ABORTED (`NOT_STARTED`): actors
        retry it, since a restarted learner may serve soon."""
        await self._ready.wait()
        if self._stopped:
            await context.abort(grpc.StatusCode.ABORTED, NOT_STARTED)
        return self.learner

    def waiting_status(self) -> rlfleet_pb2.Status:
        """The `Status` while no learner is attached: the phase and what it waits for (`waiting`), the uptime,
        no counts."""
        phase, waiting_for = self.waiting
        nan = float("nan")
        return rlfleet_pb2.Status(
            phase=phase,
            waiting_for=waiting_for,
            uptime_seconds=time.monotonic() - self._start_time,
            episode_return_mean=nan,
            eval_return_mean=nan,
        )

    def serve_waiting(self, phase: str | None = None, waiting_for: str = "") -> None:
        """Answers before the learner is ready: status (the attached learner's, or else `phase` and
        `waiting_for`), health NOT_SERVING; the actors' calls wait for `start`."""
        if phase is not None:
            self.waiting = (phase, waiting_for)
        self._run(self._serve(ready=False))

    def start(self) -> None:
        """Serves the attached learner: opens the actors' calls and reports SERVING on the health service
        (overall and for rlfleet.Learner)."""
        self._run(self._serve(ready=True))

    async def _serve(self, ready: bool) -> None:
        if not self._serving:
            for service in ("", _SERVICE):  # the health servicer starts out SERVING
                await self.health.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
            await self._server.start()
            self._serving = True
        if ready:
            self._ready.set()
            for service in ("", _SERVICE):
                await self.health.set(service, health_pb2.HealthCheckResponse.SERVING)

    def stop(self, grace_s: float = 1.0) -> None:
        """Ends the weight streams, reports NOT_SERVING, stops the server (calls in flight get `grace_s`
        seconds) and the event loop thread. A second call does nothing."""
        if self._stopped:
            return
        self._stopped = True
        if self.learner is not None:
            self.learner.weights.close()

        async def stop():
            self._ready.set()  # calls held for a learner that never served end now (`ready_learner`)
            await self.health.enter_graceful_shutdown()
            await self._server.stop(grace_s)

        try:
            self._run(stop(), timeout=grace_s + 10)
        finally:
            self._shutdown_loop()

    def _shutdown_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()


def bind_learner_server(learner, bind: str, port: int, tls: tuple | None = None, token: str = "") -> LearnerServer:
    """The learner's `LearnerServer` bound to `bind`:`port` (port 0: a free one), not started yet.

    Args:
        learner: what `LearnerServer` serves (None: attached later); token: see `LearnerServer`.
        tls: (cert PEM path, key PEM path, client CA PEM path or None) to serve TLS; None: plaintext.
    Raises:
        rlfleet.learner.errors.LearnerError: the address cannot be bound; the message says why and what to
            choose instead.
    """
    # Weight streams and unary calls share no thread pool (asyncio server); no SO_REUSEPORT, so a second
    # learner on a port that one already holds fails here instead of splitting the actors between the two.
    problem = bind_problem(bind, port)
    if problem is None:
        try:
            credentials = server_credentials(*tls) if tls else None
            return LearnerServer(learner, host_port(bind, port), GRPC_OPTIONS, credentials, token)
        except BindError:
            problem = bind_problem(bind, port) or "gRPC refused the address"
    raise LearnerError(
        f"cannot bind the learner service to {host_port(bind, port)}: {problem}; choose another "
        "--bind address or --port (--learner-port for `rlfleet up`)."
    )
