"""Shared fixtures: rlfleet service processes on loopback ports (the helpers they use are in helpers.py)."""

import portpicker
import pytest
from helpers import ENV, Proc


@pytest.fixture
def procs(tmp_path):
    """Starts processes via procs.start(name, *args, env=ENV); stops them all at the end of the test."""
    started = []

    class Starter:
        def start(self, name, *args, env=ENV):
            p = Proc(tmp_path, name, *args, env=env)
            started.append(p)
            return p

    yield Starter()
    for p in reversed(started):
        p.stop()


@pytest.fixture
def free_port():
    return portpicker.pick_unused_port
