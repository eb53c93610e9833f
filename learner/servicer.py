"""The learner's gRPC face: the `rlfleet.Learner` servicer (proto/rlfleet.proto) and the weights fan-out.

The servicer only translates between messages and the learner (`rlfleet.learner.service.Learner`):
registration and heartbeats go to its actor registry, status comes from its status dict, and weight
streams read a `WeightsBroadcast`, where each policy version is one message shared by every stream.
"""

from __future__ import annotations

import threading

import grpc

from rlfleet.proto import rlfleet_pb2, rlfleet_pb2_grpc


class WeightsBroadcast:
    """The latest `Weights` message; streams wait here for a newer policy version. Thread-safe."""

    def __init__(self):
        self._cond = threading.Condition()
        self.latest: rlfleet_pb2.Weights | None = None
        self._closed = False

    def publish(self, msg: rlfleet_pb2.Weights) -> None:
        """Makes `msg` the version every stream sends next."""
        with self._cond:
            self.latest = msg
            self._cond.notify_all()

    def close(self) -> None:
        """Ends every stream (the learner stops)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def stream(self, min_policy_version: int, is_active):
        """Yields each newer message from policy version `min_policy_version` on, while `is_active()` and
        the broadcast is open. A caller that holds a newer version than the latest (a learner restarted
        from an older checkpoint) gets the latest at once."""
        sent = min_policy_version - 1
        while is_active():
            with self._cond:
                if self.latest is not None and sent > self.latest.policy_version:
                    sent = -1
                self._cond.wait_for(
                    lambda sent=sent: self._closed or (self.latest is not None and self.latest.policy_version > sent),
                    timeout=1.0,
                )
                if self._closed:
                    return
                msg = self.latest
            if msg is not None and msg.policy_version > sent:
                sent = msg.policy_version
                yield msg


class LearnerServicer(rlfleet_pb2_grpc.LearnerServicer):
    """`rlfleet.Learner` over a `Learner` (`rlfleet.learner.service`): RegisterActor, StreamWeights,
    Heartbeat, GetStatus."""

    def __init__(self, learner):
        self.learner = learner

    def RegisterActor(self, request, context):
        envs = self.learner.config.envs_per_actor
        if request.num_envs and request.num_envs != envs:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"actor asked for {request.num_envs} envs but this run's replay items hold {envs} envs per "
                f"actor; start the actor without --num-envs or with --num-envs {envs}.",
            )
        address = peer_ip(context.peer())
        actor_id = self.learner.admit_actor(request.host or address, address)
        return rlfleet_pb2.RegisterActorResponse(actor_id=actor_id, config=self.learner.run_config(actor_id))

    def StreamWeights(self, request, context):
        yield from self.learner.weights.stream(request.min_policy_version, context.is_active)

    def Heartbeat(self, request, context):
        stop = self.learner.record_heartbeat(request, peer_ip(context.peer()))
        return rlfleet_pb2.HeartbeatResponse(stop=stop)

    def GetStatus(self, request, context):
        return self.learner.status_proto()


def peer_ip(peer: str) -> str:
    """The IP address in a gRPC peer string ("ipv4:10.0.0.2:5432" or "ipv6:[::1]:5432")."""
    kind, _, rest = peer.partition(":")
    host = rest.rsplit(":", 1)[0] if kind in ("ipv4", "ipv6") else peer
    return host.strip("[]")
