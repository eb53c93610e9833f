"""`replay_link` against a real Reverb server: a server answers on a new connection and on the writers' one; a
server that is gone answers on neither, which is not a dead connection."""

import portpicker
import reverb

from rlfleet.actors.replay_link import (
    answers_on_new_connection,
    answers_on_writers_connection,
    connection_died_silently,
)


def test_a_live_server_answers_on_both_connections_and_a_gone_one_on_neither():
    port = portpicker.pick_unused_port()
    server = reverb.Server([reverb.Table.queue("queue", max_size=2)], port=port)
    address = f"127.0.0.1:{port}"
    try:
        assert answers_on_new_connection(address, 10) and answers_on_writers_connection(address, 10)
        assert not connection_died_silently(address, 10)
    finally:
        server.stop()
    assert not answers_on_new_connection(address, 1)
    assert not connection_died_silently(address, 1)  # down, not a dead connection: the actor waits for it
