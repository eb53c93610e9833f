"""benchmarks/actor_memory.py on a real `rlfleet up`: it reads every actor's memory, and stops what it started;
the actors write into Reverb without loading TensorFlow's Python."""

import os
import sys

import psutil
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import actor_memory  # noqa: E402

pytestmark = pytest.mark.slow


def test_actor_memory_reads_each_actor_and_stops_the_cluster():
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    actors = actor_memory.measure_actors(2, "dqn", "CartPole-v1", settle_s=1.0)
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before  # `up` and its children are gone
    assert len(actors) == 2 and len({a["pid"] for a in actors}) == 2
    for a in actors:
        # Reverb's compiled client, but not TensorFlow's Python: `rlfleet.actors.replay_client` loads only the
        # framework library it links against.
        assert a["reverb_client"] and not a["tensorflow_python"], a
        # Its proportional share lies between what is its own and what is resident.
        assert 0 < a["private_mb"] < a["pss_mb"] < a["rss_mb"], a
    # Less of its own than a Python process that imports TensorFlow, measured here too.
    with_tensorflow = actor_memory.baseline()["+ tensorflow"]
    assert max(a["private_mb"] for a in actors) < with_tensorflow["private_mb"] / 2, (actors, with_tensorflow)


def test_children_finds_a_child_by_its_command_line(tmp_path):
    import subprocess

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "marker-for-the-test"])
    try:
        assert actor_memory.children(os.getpid(), "marker-for-the-test") == [child.pid]
        assert actor_memory.children(os.getpid(), "no-such-marker") == []
    finally:
        child.kill()
        child.wait()
