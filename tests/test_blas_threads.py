"""Actors and learners run numpy's BLAS on one thread unless the user chose a number (deploy/cli_common.py)."""

import json
import os
import subprocess
import sys

import pytest
from helpers import ROOT

PROBE = """
import json
from rlfleet.deploy.cli_common import one_blas_thread
one_blas_thread()  # before this process imports numpy itself: the function loads what it limits
from threadpoolctl import threadpool_info
import numpy as np
np.ones((64, 256), np.float32) @ np.ones((256, 256), np.float32)
print(json.dumps([p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]))
"""


def _blas_threads(**env):
    base = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env={**base, **env}, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_one_blas_thread_unless_the_user_set_one():
    if len(os.sched_getaffinity(0)) < 2:  # OpenBLAS sizes its pool by the CPUs this process may run on
        pytest.skip("one core: BLAS runs one thread anyway")
    assert _blas_threads() == [1]
    # The user's variable stands (OpenBLAS reads it when numpy loads it).
    assert _blas_threads(OPENBLAS_NUM_THREADS="2") == [2]
