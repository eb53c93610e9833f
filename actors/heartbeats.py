"""An actor's heartbeats to the learner, without TensorFlow (simulated actors and tools import this too).

`HEARTBEAT_S` is how often an actor reports its env steps, policy version and finished episodes;
`HeartbeatStream` sends those reports on the learner's Heartbeats stream (proto/rlfleet.proto).
"""

from __future__ import annotations

import queue
import threading

import grpc

from rlfleet.proto import rlfleet_pb2

HEARTBEAT_S = 1.0  # seconds between an actor's heartbeats


class HeartbeatStream:
    """The actor's end of the learner's Heartbeats stream (proto/rlfleet.proto): one stream for the actor's life,
    a reply for each beat. Falls back to one unary Heartbeat call per beat when the learner predates the stream
    (UNIMPLEMENTED), and tries the stream again after a unary beat fails (the learner may have been upgraded
    meanwhile). Used by one thread at a time.

    Args:
        stub: a `LearnerStub` on the actor's channel (its token and TLS apply to the stream too).
    """

    def __init__(self, stub):
        self.stub = stub
        self.unary = False  # the learner answered the stream with UNIMPLEMENTED: beats are unary calls
        self._requests: queue.SimpleQueue | None = None
        self._responses = None

    def beat(self, request: rlfleet_pb2.HeartbeatRequest, timeout_s: float) -> rlfleet_pb2.HeartbeatResponse:
        """Sends one heartbeat and returns the learner's reply. A stream that ended since the last beat (the
        learner restarted, keepalive closed the connection) is replaced before sending; one that fails or gives
        no reply within `timeout_s` seconds is closed (the next beat opens a new one).

        Raises:
            grpc.RpcError: the beat failed (learner unreachable or restarting; CANCELLED after `timeout_s`).
        """
        if self.unary:
            try:
                return self.stub.Heartbeat(request, timeout=timeout_s)
            except grpc.RpcError:
                self.unary = False  # the next beat asks for the stream again
                raise
        if self._responses is not None and self._responses.done():
            self.close()
        if self._responses is None:
            self._requests = queue.SimpleQueue()
            self._responses = self.stub.Heartbeats(iter(self._requests.get, None))
        responses = self._responses
        self._requests.put(request)
        watchdog = threading.Timer(timeout_s, responses.cancel)  # cancels this beat's call only
        watchdog.start()
        try:
            return next(responses)
        except StopIteration:  # the stream ended without an error (e.g. a proxy closed it)
            self.close()
            raise _StreamEnded() from None
        except grpc.RpcError as e:
            self.close()
            if e.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise
            self.unary = True
            return self.stub.Heartbeat(request, timeout=timeout_s)
        finally:
            watchdog.cancel()

    def close(self) -> None:
        """Ends the stream (the learner sees it close); the next `beat` opens a new one."""
        if self._requests is not None:
            self._requests.put(None)
        if self._responses is not None:
            self._responses.cancel()
        self._requests = self._responses = None


class _StreamEnded(grpc.RpcError):
    """The heartbeat stream ended without an error status before the reply (an rlfleet learner does not end it;
    a proxy in between may): treated like an unreachable learner."""

    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return "the heartbeat stream ended before the learner's reply"
