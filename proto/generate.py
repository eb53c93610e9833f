"""Regenerate `proto/rlfleet_pb2.py` and `proto/rlfleet_pb2_grpc.py`.

Usage: ``python -m proto.generate [OUT_DIR]`` from the repository root.
The generated modules are committed; ``tests/test_proto.py`` fails when they
are stale against ``proto/rlfleet.proto``.
"""
import os
import sys

from grpc_tools import protoc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def generate(out_dir: str = ROOT) -> None:
    """Runs protoc on proto/rlfleet.proto, writing into OUT_DIR/proto/.

    Raises:
        RuntimeError: if protoc fails.
    """
    os.makedirs(os.path.join(out_dir, "proto"), exist_ok=True)
    rc = protoc.main([
          "grpc_tools.protoc", f"-I{ROOT}", f"--python_out={out_dir}",
          f"--grpc_python_out={out_dir}",
          os.path.join(ROOT, "proto", "rlfleet.proto")])
    if rc != 0:
        raise RuntimeError(f"protoc failed with exit code {rc}")


if __name__ == "__main__":
    generate(sys.argv[1] if len(sys.argv) > 1 else ROOT)
