"""Conversion between named numpy arrays and the `Weights` protobuf message."""

from __future__ import annotations

import numpy as np

from rlfleet.proto import rlfleet_pb2

# gRPC's default 4 MiB message limit is below one Nature CNN weights message (~6.7 MB);
# both the learner server and the actors' channels allow this much.
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
GRPC_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]


def to_proto(policy_version: int, arrays: dict, exploration: dict | None = None) -> rlfleet_pb2.Weights:
    """Packs {name: ndarray} into a `Weights` message of the given policy version, with the behaviour
    policy's `exploration` ({field of the `Exploration` message: value}, e.g. {"epsilon": 0.1}).

    Raises:
        ValueError: an `exploration` key that the `Exploration` message does not have.
    """
    try:
        msg = rlfleet_pb2.Weights(policy_version=policy_version, exploration=exploration or {})
    except ValueError as e:
        raise ValueError(f"exploration {exploration}: {e} (the fields of Exploration in proto/rlfleet.proto)") from None
    for name, a in sorted(arrays.items()):
        a = np.ascontiguousarray(a)
        msg.arrays.add(name=name, shape=list(a.shape), dtype=a.dtype.str, data=a.tobytes())
    return msg


def from_proto(msg: rlfleet_pb2.Weights) -> tuple[int, dict]:
    """Unpacks a `Weights` message into (policy version, {name: ndarray})."""
    arrays = {a.name: np.frombuffer(a.data, dtype=np.dtype(a.dtype)).reshape(tuple(a.shape)) for a in msg.arrays}
    return msg.policy_version, arrays
