"""benchmarks/env_backends.py: each backend and `auto` measured on a user's own env through real replay, learner
and actor processes, the backends that cannot step the env left out, auto's rate set against the fastest, and
layouts of several actors collected."""

import json
import os
import subprocess
import sys

import pytest
from helpers import ENV, ROOT

pytestmark = pytest.mark.slow


def test_backends_side_by_side_on_an_own_env(tmp_path):
    out = tmp_path / "backends.json"
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "env_backends.py"), "--workloads", "pointmass",
           "--backends", "auto", "sync", "envpool", "--seconds", "2", "--repeats", "2", "--layouts", "2x2",
           "--out", str(out)]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "envpool cannot step it" in done.stdout  # a user's own env: envpool does not have it
    [r] = json.loads(out.read_text())["results"]
    assert r["env_id"] == "python_envs:PointMass-v0" and r["single_env"] > 0
    for key in ("raw", "collection"):
        assert set(r["samples"][key]) == {"auto", "sync"} and all(len(v) == 2 for v in r["samples"][key].values())
        assert all(rate > 0 for rate in r[key].values())
        assert r[f"{key}_fastest"] == "sync"
        assert r[f"{key}_auto_fraction_of_fastest"] == pytest.approx(r[key]["auto"] / r[key]["sync"])
    assert [c["choice"] for c in r["auto_in_process"]] == ["sync", "sync"]  # microsecond steps stay in process
    assert r["auto_in_collection"] == [["sync"], ["sync"]]  # and so in the real actor, as its status says
    # Two actor processes of 2 envs each, collected twice.
    assert list(r["layouts"]) == ["2x2"] and len(r["layouts"]["2x2"]) == 2 and min(r["layouts"]["2x2"]) > 0
    assert r["layout_backends"] == {"2x2": [["sync", "sync"], ["sync", "sync"]]}
    assert json.loads(out.read_text())["settings"]["repeats"] == 2
