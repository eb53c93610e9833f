"""`rlfleet.actors.replay_client` in fresh processes against a real Reverb server: it writes items checked
against the table signature, times out on a full table with Reverb's DeadlineExceededError, answers ServerInfo,
and does all of it without importing TensorFlow's Python; afterwards the whole `reverb` package still imports,
reads what was written, and its writers' timeouts are caught the same way. A Reverb that cannot be loaded alone
is imported whole, with a warning."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import portpicker
import reverb
import tensorflow as tf

CHILD = textwrap.dedent(
    """
    import sys
    import numpy as np
    from rlfleet.actors import replay_client

    address = sys.argv[1]
    modules = replay_client.load()
    assert not modules.whole_package, "loaded with the whole reverb package"
    assert "tensorflow" not in sys.modules and "reverb" not in sys.modules, sorted(sys.modules)
    client = replay_client.Client(address)
    assert client.server_info_answered(5)
    writer = client.trajectory_writer(num_keep_alive_refs=3)
    for i in range(6):
        writer.append({"x": np.float32(i), "y": np.full(2, i, np.int32)})
        if i >= 2:
            writer.create_item("items", 1.0, {k: col[-3:] for k, col in writer.history.items()})
    writer.flush()
    try:  # the table holds 4 items: the fifth stays pending
        writer.append({"x": np.float32(6), "y": np.full(2, 6, np.int32)})
        writer.create_item("items", 1.0, {k: col[-3:] for k, col in writer.history.items()})
        writer.flush(block_until_num_items=0, timeout_ms=300)
        raise SystemExit("a full table took the item")
    except replay_client.deadline_exceeded_errors():
        pass
    bad = client.trajectory_writer(num_keep_alive_refs=1)
    bad.append({"x": np.float64(0.0), "y": np.zeros(2, np.int32)})
    try:
        bad.create_item("items", 1.0, {k: col[-1:] for k, col in bad.history.items()})
        bad.flush(timeout_ms=3000)
        raise SystemExit("an item against the signature was taken")
    except ValueError as e:  # checked against the signature before it is sent
        print("refused:", str(e).splitlines()[0])
    try:
        client.trajectory_writer(num_keep_alive_refs=0)
        raise SystemExit("a writer that keeps no step was made")
    except ValueError:
        pass
    writer.close()
    assert "tensorflow" not in sys.modules
    import reverb  # the whole package, after the writer modules alone

    info = reverb.Client(address).server_info(5)
    print("size", info["items"].current_size)
    # The package's writers raise the package's own class, which `deadline_exceeded_errors` names too.
    assert len(replay_client.deadline_exceeded_errors()) == 2
    other = reverb.Client(address).trajectory_writer(num_keep_alive_refs=3)
    for i in range(7, 10):
        other.append({"x": np.float32(i), "y": np.full(2, i, np.int32)})
    other.create_item("items", 1.0, {k: col[-3:] for k, col in other.history.items()})
    try:  # the table is still full
        other.flush(block_until_num_items=0, timeout_ms=300)
        raise SystemExit("a full table took the item")
    except replay_client.deadline_exceeded_errors() as e:
        assert type(e) is reverb.errors.DeadlineExceededError
    """
)

# Where Reverb's writer cannot be loaded alone, the whole package is: with a warning, and a writer that works.
FALLBACK = textwrap.dedent(
    """
    import logging, sys
    import numpy as np
    from rlfleet.actors import replay_client

    logging.basicConfig(level=logging.WARNING)
    replay_client._FRAMEWORK_LIBRARY = "libno-such-framework.so"
    modules = replay_client.load()
    assert modules.whole_package and "tensorflow" in sys.modules
    import reverb
    assert hasattr(reverb, "Client") and modules.errors is sys.modules["reverb.errors"]  # no stand-in left
    assert replay_client.deadline_exceeded_errors() == (reverb.errors.DeadlineExceededError,)
    writer = replay_client.Client(sys.argv[1]).trajectory_writer(num_keep_alive_refs=3)
    for i in range(3):
        writer.append({"x": np.float32(i), "y": np.full(2, i, np.int32)})
    writer.create_item("items", 1.0, {k: col[-3:] for k, col in writer.history.items()})
    writer.flush(timeout_ms=10000)
    print("written")
    """
)


def _server(max_size: int):
    signature = {"x": tf.TensorSpec([3], tf.float32), "y": tf.TensorSpec([3, 2], tf.int32)}
    port = portpicker.pick_unused_port()
    return reverb.Server([reverb.Table.queue("items", max_size=max_size, signature=signature)], port=port), port


def _child(code: str, address: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "RLFLEET_PLUGINS"}
    return subprocess.run(
        [sys.executable, "-c", code, address],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(env, TF_CPP_MIN_LOG_LEVEL="2"),
    )


def test_writes_without_tensorflow_then_the_whole_package_imports():
    server, port = _server(max_size=4)
    try:
        res = _child(CHILD, f"127.0.0.1:{port}")
        assert res.returncode == 0, res.stdout + res.stderr
        assert "size 4" in res.stdout and "refused:" in res.stdout, res.stdout
        sample = next(reverb.Client(f"127.0.0.1:{port}").sample("items", 1, emit_timesteps=False))
        x, y = sample.data  # the signature's fields, flattened in key order
        np.testing.assert_array_equal(x, [0.0, 1.0, 2.0])
        np.testing.assert_array_equal(y, [[0, 0], [1, 1], [2, 2]])
    finally:
        server.stop()


def test_a_reverb_that_cannot_be_loaded_alone_is_imported_whole_with_a_warning():
    server, port = _server(max_size=4)
    try:
        res = _child(FALLBACK, f"127.0.0.1:{port}")
        assert res.returncode == 0 and "written" in res.stdout, res.stdout + res.stderr
        assert "importing the whole reverb package" in res.stderr and "libno-such-framework.so" in res.stderr
    finally:
        server.stop()


def test_server_info_is_answered_by_a_live_server_only():
    from rlfleet.actors.replay_client import Client

    server, port = _server(max_size=1)
    try:
        assert Client(f"127.0.0.1:{port}").server_info_answered(5)
    finally:
        server.stop()
    assert not Client(f"127.0.0.1:{port}").server_info_answered(1)
