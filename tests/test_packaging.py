"""Installing rlfleet adds one top-level name, `rlfleet`, and leaves other distributions alone.

Before the namespace, rlfleet installed five generic top-level modules; its `proto` shadowed
proto-plus (the runtime under Google's cloud client libraries), and uninstalling rlfleet deleted
proto-plus's own `proto/__init__.py`. This test builds rlfleet's wheel from the checkout and
installs it next to proto-plus in a fresh virtualenv, from local wheels only.
"""

import glob
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile

import pytest
from helpers import ROOT

pytestmark = pytest.mark.slow


def _run(*cmd, cwd=None):
    """Runs a command to completion; fails the test with its output when it fails."""
    out = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600, cwd=cwd)
    assert out.returncode == 0, f"{cmd} failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out.stdout


def test_install_next_to_proto_plus_and_uninstall(tmp_path):
    wheels, venv = tmp_path / "wheels", tmp_path / "venv"
    src = tmp_path / "src"  # build from a copy: the build leaves nothing in the checkout
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(ROOT, name), src)
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        folders = tomllib.load(f)["tool"]["setuptools"]["package-dir"].values()  # rlfleet.<part> -> folder
    for part in folders:
        shutil.copytree(os.path.join(ROOT, part), src / part, ignore=shutil.ignore_patterns("__pycache__"))
    _run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", wheels, src)
    wheel = glob.glob(str(wheels / "rlfleet-*.whl"))
    assert len(wheel) == 1
    top_level = {name.split("/")[0] for name in zipfile.ZipFile(wheel[0]).namelist()}
    assert {t for t in top_level if not t.endswith(".dist-info")} == {"rlfleet"}, top_level
    # proto-plus and the protobuf it needs, at the version this environment pins.
    _run(
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "-d",
        wheels,
        "proto-plus",
        f"protobuf=={importlib.metadata.version('protobuf')}",
    )
    _run(sys.executable, "-m", "venv", venv)
    pip, python = venv / "bin" / "pip", venv / "bin" / "python"
    install = [pip, "install", "--quiet", "--no-deps", "--no-index", "--find-links", wheels]
    _run(*install, "proto-plus", "protobuf")
    check_proto_plus = "import proto; assert proto.Message.__module__.startswith('proto.'), proto.__file__"
    _run(python, "-c", check_proto_plus, cwd=tmp_path)
    _run(*install, "rlfleet")
    # Both import side by side; rlfleet's generated modules register under their namespaced file name.
    _run(
        python,
        "-c",
        check_proto_plus + "; from rlfleet.proto import rlfleet_pb2 as pb; "
        "assert pb.DESCRIPTOR.name == 'rlfleet/proto/rlfleet.proto', pb.DESCRIPTOR.name; pb.Status()",
        cwd=tmp_path,
    )
    # Every built-in algorithm's folder is in the wheel (the registry imports each builder, which needs no
    # TensorFlow).
    _run(
        python,
        "-c",
        "from rlfleet import algorithms; n = algorithms.names(); assert n[:3] == ['ppo', 'dqn', 'qdagger'], n",
        cwd=tmp_path,
    )
    _run(pip, "uninstall", "--quiet", "-y", "rlfleet")
    _run(
        python,
        "-c",
        check_proto_plus + "; import importlib.metadata as m\n"
        "try:\n    m.distribution('rlfleet')\nexcept m.PackageNotFoundError:\n    pass\n"
        "else:\n    raise SystemExit('rlfleet is still installed')",
        cwd=tmp_path,
    )
