"""`replay_link.insert_admitted` against a real Reverb server: it says False exactly when the table's rate limiter
holds the next insert back, so that an actor never mistakes backpressure for a dead connection."""

import numpy as np
import portpicker
import pytest
import reverb

from rlfleet.actors.replay_link import insert_admitted


@pytest.fixture
def server():
    port = portpicker.pick_unused_port()
    ratio = reverb.rate_limiters.SampleToInsertRatio(samples_per_insert=2.0, min_size_to_sample=2, error_buffer=3.0)
    s = reverb.Server(
        [
            reverb.Table.queue("queue", max_size=2),
            reverb.Table("ratio", reverb.selectors.Uniform(), reverb.selectors.Fifo(), 100, ratio),
        ],
        port=port,
    )
    yield f"127.0.0.1:{port}"
    s.stop()


@pytest.mark.parametrize("table", ["queue", "ratio"])
def test_insert_admitted_says_whether_the_next_insert_goes_through(server, table):
    client = reverb.Client(server)
    writer = client.trajectory_writer(num_keep_alive_refs=1)
    outcomes = []
    try:
        for _ in range(8):
            admitted = insert_admitted(server, table)
            writer.append({"x": np.zeros(2, np.float32)})
            writer.create_item(table, 1.0, {"x": writer.history["x"][-1:]})
            try:
                writer.flush(timeout_ms=1000)
                went_through = True
            except reverb.errors.DeadlineExceededError:
                went_through = False
            outcomes.append((admitted, went_through))
            assert admitted is went_through, outcomes
            while not went_through:  # sample until the held insert goes through
                next(iter(client.sample(table, num_samples=1)))
                try:
                    writer.flush(timeout_ms=1000)
                    went_through = True
                except reverb.errors.DeadlineExceededError:
                    pass
        assert (True, True) in outcomes and (False, False) in outcomes, outcomes  # both cases were seen
    finally:
        writer.close()


def test_insert_admitted_knows_nothing_of_a_missing_table_or_server(server):
    assert insert_admitted(server, "no-such-table") is None
    free = f"127.0.0.1:{portpicker.pick_unused_port()}"
    assert insert_admitted(free, "queue", timeout_s=1.0) is None
