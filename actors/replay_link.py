"""Whether the replay server would take an insert into a table now, asked over a new connection of its own.

An actor whose writes stop being confirmed cannot tell from its writer alone whether the table's rate limiter
holds them back (a full PPO queue, a DQN replay ratio) or the connection died without a FIN or RST (a NAT or
firewall that dropped its state, a frozen link): Reverb's client sends no keepalive pings, so a dead connection
waits on TCP's retransmission timeout (about 15 minutes). This asks the server itself, through a separate
connection (grpcio, not Reverb's client, whose channels to one address share a connection), for the table's
rate limiter state (Reverb's `ServerInfo` RPC, reverb/cc/reverb_service.proto and reverb/cc/schema.proto).
"""

from __future__ import annotations

import functools

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_PACKAGE = "rlfleet.reverb_server_info"


@functools.cache
def _server_info_response():
    """The fields of Reverb's `ServerInfoResponse` that `insert_admitted` reads, by their field numbers."""
    f = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="rlfleet_reverb_server_info.proto", package=_PACKAGE, syntax="proto3")

    def message(name, fields):
        msg = fdp.message_type.add(name=name)
        for field_name, number, kind, label, type_name in fields:
            msg.field.add(name=field_name, number=number, type=kind, label=label, type_name=type_name)

    one, many, nested = f.LABEL_OPTIONAL, f.LABEL_REPEATED, f.TYPE_MESSAGE
    message("CallStats", [("completed", 2, f.TYPE_INT64, one, None)])
    message(
        "RateLimiterInfo",
        [
            ("samples_per_insert", 1, f.TYPE_DOUBLE, one, None),
            ("min_diff", 2, f.TYPE_DOUBLE, one, None),
            ("max_diff", 3, f.TYPE_DOUBLE, one, None),
            ("min_size_to_sample", 4, f.TYPE_INT64, one, None),
            ("insert_stats", 5, nested, one, f".{_PACKAGE}.CallStats"),
            ("sample_stats", 6, nested, one, f".{_PACKAGE}.CallStats"),
        ],
    )
    message(
        "TableInfo",
        [
            ("max_size", 3, f.TYPE_INT64, one, None),
            ("rate_limiter_info", 5, nested, one, f".{_PACKAGE}.RateLimiterInfo"),
            ("current_size", 7, f.TYPE_INT64, one, None),
            ("name", 8, f.TYPE_STRING, one, None),
        ],
    )
    message("ServerInfoResponse", [("table_info", 2, nested, many, f".{_PACKAGE}.TableInfo")])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.ServerInfoResponse"))


def admits_insert(table) -> bool:
    """Whether a table (a `TableInfo` message) would take one more item now: Reverb's `RateLimiter::CanInsert`
    (reverb/cc/rate_limiter.cc) on the counts the server reports, with the current size standing for inserts −
    deletes: free below `min_size_to_sample`, else while (inserts + 1) × samples_per_insert − samples stays at
    most `max_diff`."""
    limiter = table.rate_limiter_info
    if table.current_size + 1 <= limiter.min_size_to_sample:
        return True
    inserts, samples = limiter.insert_stats.completed, limiter.sample_stats.completed
    return (inserts + 1) * limiter.samples_per_insert - samples <= limiter.max_diff


def insert_admitted(address: str, table: str, timeout_s: float = 2.0) -> bool | None:
    """Asks the replay server at `address` (host:port) whether `table` would take an insert now (`admits_insert`).

    Returns:
        True or False; None when the server does not answer within `timeout_s` seconds (busy, e.g. writing a
        checkpoint, which holds its tables, or down), fails, or has no such table: nothing is known then.
    """
    response = _server_info_response()
    try:
        with grpc.insecure_channel(address) as ch:
            call = ch.unary_unary(
                "/deepmind.reverb.ReverbService/ServerInfo",
                request_serializer=lambda _: b"",  # ServerInfoRequest has no fields
                response_deserializer=response.FromString,
            )
            info = call(None, timeout=timeout_s, wait_for_ready=False)
    except grpc.RpcError:
        return None
    for t in info.table_info:
        if t.name == table:
            return admits_insert(t)
    return None
