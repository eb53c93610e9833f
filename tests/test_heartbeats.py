"""The actor's heartbeats (`rlfleet.actors.heartbeats.HeartbeatStream`) against gRPC servers on loopback: one
Heartbeats stream carries every beat; a learner without the stream gets unary Heartbeat calls; a stream that
gives no reply is given up after the timeout and the next beat opens a new one; a learner that went away and
came back on the same port gets the next beat; the learner's own server (`LearnerServer`) answers on the stream,
with and without a token."""

import threading
import time
from concurrent import futures

import grpc
import pytest

from rlfleet.actors.heartbeats import HeartbeatStream
from rlfleet.learner.servicer import LearnerServer, WeightsBroadcast
from rlfleet.proto import rlfleet_pb2, rlfleet_pb2_grpc
from rlfleet.proto.security import ClientSecurity, channel


class _Learner(rlfleet_pb2_grpc.LearnerServicer):
    """Books every beat it gets and how (stream or unary); `stream=False` leaves Heartbeats UNIMPLEMENTED,
    `silent=True` reads stream beats but never answers them."""

    def __init__(self, stream=True, silent=False):
        self.stream, self.silent = stream, silent
        self.unary_beats, self.stream_beats, self.streams_opened = [], [], 0
        self.lock = threading.Lock()

    def Heartbeat(self, request, context):
        self.unary_beats.append(request.env_steps)
        return rlfleet_pb2.HeartbeatResponse(stop=request.env_steps >= 100)

    def Heartbeats(self, request_iterator, context):
        with self.lock:
            self.streams_opened += 1
        if not self.stream:  # as the generated base class answers for a method the server lacks
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!")
        for request in request_iterator:
            self.stream_beats.append(request.env_steps)
            if not self.silent:
                yield rlfleet_pb2.HeartbeatResponse(stop=request.env_steps >= 100)


def _serve(learner, port=0):
    server = grpc.server(futures.ThreadPoolExecutor(8), options=[("grpc.so_reuseport", 0)])
    rlfleet_pb2_grpc.add_LearnerServicer_to_server(learner, server)
    port = server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server, port


@pytest.fixture
def serve():
    servers = []

    def start(learner, port=0):
        server, port = _serve(learner, port)
        servers.append(server)
        return server, port

    yield start
    for s in servers:
        s.stop(0)


def _beat(hb, steps, timeout_s=5.0):
    return hb.beat(rlfleet_pb2.HeartbeatRequest(actor_id=3, env_steps=steps), timeout_s)


def test_one_stream_carries_every_beat_and_the_replies_come_back_in_order(serve):
    learner = _Learner()
    _, port = serve(learner)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        hb = HeartbeatStream(rlfleet_pb2_grpc.LearnerStub(ch))
        stops = [_beat(hb, steps).stop for steps in (10, 20, 100, 30)]
        hb.close()
    assert stops == [False, False, True, False]
    assert learner.stream_beats == [10, 20, 100, 30] and learner.unary_beats == []
    assert learner.streams_opened == 1 and not hb.unary


def test_a_learner_without_the_stream_gets_unary_beats(serve):
    learner = _Learner(stream=False)
    _, port = serve(learner)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        hb = HeartbeatStream(rlfleet_pb2_grpc.LearnerStub(ch))
        stops = [_beat(hb, steps).stop for steps in (10, 100, 20)]
    assert stops == [False, True, False]
    assert learner.unary_beats == [10, 100, 20] and learner.stream_beats == []
    assert hb.unary and learner.streams_opened == 1  # asked once, then unary only


def test_a_stream_without_replies_fails_after_the_timeout_and_the_next_beat_opens_another(serve):
    learner = _Learner(silent=True)
    _, port = serve(learner)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        hb = HeartbeatStream(rlfleet_pb2_grpc.LearnerStub(ch))
        for steps in (10, 20):
            t = time.monotonic()
            with pytest.raises(grpc.RpcError) as e:
                _beat(hb, steps, timeout_s=1.0)
            assert e.value.code() == grpc.StatusCode.CANCELLED
            assert 0.9 < time.monotonic() - t < 5.0
        learner.silent = False
        assert _beat(hb, 100).stop
        hb.close()
    assert learner.streams_opened == 3 and learner.stream_beats == [10, 20, 100]


def test_beats_reach_a_learner_that_came_back_on_the_same_port(serve):
    first = _Learner()
    server, port = serve(first)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        hb = HeartbeatStream(rlfleet_pb2_grpc.LearnerStub(ch))
        _beat(hb, 10)
        server.stop(0).wait()
        with pytest.raises(grpc.RpcError) as e:
            _beat(hb, 20)
        assert e.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
        second = _Learner()
        serve(second, port)
        grpc.channel_ready_future(ch).result(timeout=30)  # the channel reconnects with backoff
        _beat(hb, 30)  # the first beat after the restart reaches it: the dead stream is replaced before sending
        hb.close()
    assert first.stream_beats == [10] and second.stream_beats == [30] and not hb.unary


class _Book:
    """What `LearnerServer` needs of a learner for heartbeats: `weights` and `record_heartbeat`."""

    def __init__(self):
        self.weights = WeightsBroadcast()
        self.beats = []

    def record_heartbeat(self, request, address):
        self.beats.append((request.actor_id, request.env_steps, address))
        return request.env_steps >= 100


@pytest.mark.parametrize("token", ["", "s3cret"])
def test_the_learner_server_answers_beats_on_the_stream(token):
    book = _Book()
    server = LearnerServer(book, "127.0.0.1:0", [], token=token)
    server.start()
    try:
        security = ClientSecurity(token=token) if token else None
        with channel(f"127.0.0.1:{server.port}", security) as ch:
            hb = HeartbeatStream(rlfleet_pb2_grpc.LearnerStub(ch))
            stops = [_beat(hb, steps).stop for steps in (10, 100)]
            hb.close()
        assert stops == [False, True] and not hb.unary
        assert book.beats == [(3, 10, "127.0.0.1"), (3, 100, "127.0.0.1")]
        if token:  # without the token the stream is refused (no unary fallback either)
            with channel(f"127.0.0.1:{server.port}") as ch:
                hb = HeartbeatStream(rlfleet_pb2_grpc.LearnerStub(ch))
                with pytest.raises(grpc.RpcError) as e:
                    _beat(hb, 20)
                assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED and not hb.unary
            assert len(book.beats) == 2
    finally:
        server.stop()
