"""Shared fixtures: rlfleet service processes on loopback ports (the helpers they use are in helpers.py)."""

import os
import subprocess

import portpicker
import pytest
from helpers import ENV, ROOT, Proc


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


@pytest.fixture(scope="session")
def rlfleet_image():
    """The rlfleet image, built offline once per test session on the Docker engine that DOCKER_HOST names
    (deploy/build-image.sh --offline; the base tarball and the wheels are cached between runs, in
    $RLFLEET_IMAGE_CACHE when set). For the tests that run it under Docker (marked `docker`)."""
    tag = "rlfleet:compose-test"
    cache = ["--cache", os.environ["RLFLEET_IMAGE_CACHE"]] if os.environ.get("RLFLEET_IMAGE_CACHE") else []
    cmd = [os.path.join(ROOT, "deploy", "build-image.sh"), "--offline", "--tag", tag, *cache]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, cwd=ROOT)
    assert res.returncode == 0, f"image build failed ({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return tag
