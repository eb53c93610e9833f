"""The committed generated modules must match proto/rlfleet.proto."""

import filecmp

from conftest import ROOT

from rlfleet.proto import generate


def test_generated_modules_are_fresh(tmp_path):
    generate.generate(str(tmp_path))
    for name in ("rlfleet_pb2.py", "rlfleet_pb2_grpc.py"):
        fresh, committed = tmp_path / "proto" / name, f"{ROOT}/proto/{name}"
        assert filecmp.cmp(fresh, committed, shallow=False), (
            f"proto/{name} is stale against proto/rlfleet.proto: run `python -m rlfleet.proto.generate`."
        )


def test_weights_round_trip():
    import numpy as np

    from rlfleet.proto import arrays

    src = {"policy/w0": np.arange(6, dtype=np.float32).reshape(2, 3), "obs_norm/mean": np.ones(3, np.float64)}
    version, out = arrays.from_proto(arrays.to_proto(7, src))
    assert version == 7
    for k, v in src.items():
        assert out[k].dtype == v.dtype and np.array_equal(out[k], v)
