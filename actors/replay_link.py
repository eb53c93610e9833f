"""Whether an actor's connection to the replay server died without a FIN or RST (a NAT or firewall that dropped
its state, a frozen link), while the server itself is fine.

Reverb's client sends no keepalive pings and takes no settings for them, so a writer on such a connection waits
for TCP to give up (Linux's default `tcp_retries2` retransmissions, minutes). A writer that stops getting items
confirmed may also just be held back by the table's rate limiter, which is no fault. The two are told apart by
asking the server the same small question (Reverb's `ServerInfo` RPC) twice: through a new Reverb client
(`rlfleet.actors.replay_client.Client`), whose channel shares the writers' connection (Reverb creates every
channel to one address with the same arguments, so gRPC gives them one connection), and through a connection of
its own (grpcio, a separate gRPC). A dead connection is one on which the first gets no answer while the second
does.
"""

from __future__ import annotations

import grpc

from rlfleet.actors.replay_client import Client


def answers_on_new_connection(address: str, timeout_s: float = 3.0) -> bool:
    """Whether the replay server at `address` (host:port) answers `ServerInfo` within `timeout_s` seconds on a
    connection opened for the question (the answer is not decoded)."""
    try:
        with grpc.insecure_channel(address) as ch:
            call = ch.unary_unary(
                "/deepmind.reverb.ReverbService/ServerInfo",
                request_serializer=lambda _: b"",  # ServerInfoRequest has no fields
                response_deserializer=lambda data: data,
            )
            call(None, timeout=timeout_s, wait_for_ready=False)
        return True
    except grpc.RpcError:
        return False


def answers_on_writers_connection(address: str, timeout_s: int = 3) -> bool:
    """Whether the replay server at `address` answers `ServerInfo` within `timeout_s` seconds through Reverb's
    client, i.e. on the connection this process's Reverb writers to `address` use."""
    return Client(address).server_info_answered(timeout_s)


def connection_died_silently(address: str, timeout_s: int = 3) -> bool:
    """True when the writers' connection to `address` gets no answer within `timeout_s` seconds while a new
    connection gets one: the writers' connection is dead, the server is not (one that is down or too busy to
    answer fails both, and says nothing about the connection)."""
    return not answers_on_writers_connection(address, timeout_s) and answers_on_new_connection(address, timeout_s)
