"""Regenerate `proto/rlfleet_pb2.py` and `proto/rlfleet_pb2_grpc.py`.

Usage: ``python -m rlfleet.proto.generate [OUT_DIR]`` from a checkout installed with
``pip install -e ".[cpu]"`` (it reads and writes the checkout's proto/ folder).
protoc compiles the file under the path it has in the installed package,
``rlfleet/proto/rlfleet.proto``, so the generated modules import each other as
``rlfleet.proto.*`` and register that name in the protobuf descriptor pool.
The generated modules are committed; ``tests/test_proto.py`` fails when they
are stale against ``proto/rlfleet.proto``.
"""

import glob
import os
import shutil
import sys
import tempfile

from grpc_tools import protoc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def generate(out_dir: str = ROOT) -> None:
    """Runs protoc on proto/rlfleet.proto, writing the two modules into OUT_DIR/proto/.

    Raises:
        RuntimeError: if protoc fails.
    """
    with tempfile.TemporaryDirectory() as tmp:
        include, gen = os.path.join(tmp, "include"), os.path.join(tmp, "gen")
        os.makedirs(os.path.join(include, "rlfleet", "proto"))
        os.makedirs(gen)
        shutil.copy(os.path.join(ROOT, "proto", "rlfleet.proto"), os.path.join(include, "rlfleet", "proto"))
        rc = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{include}",
                f"--python_out={gen}",
                f"--grpc_python_out={gen}",
                os.path.join(include, "rlfleet", "proto", "rlfleet.proto"),
            ]
        )
        if rc != 0:
            raise RuntimeError(f"protoc failed with exit code {rc}")
        os.makedirs(os.path.join(out_dir, "proto"), exist_ok=True)
        for path in glob.glob(os.path.join(gen, "rlfleet", "proto", "rlfleet_pb2*.py")):
            shutil.copy(path, os.path.join(out_dir, "proto"))


if __name__ == "__main__":
    generate(sys.argv[1] if len(sys.argv) > 1 else ROOT)
