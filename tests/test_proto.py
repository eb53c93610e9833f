"""The committed generated modules must match proto/rlfleet.proto."""

import filecmp

from helpers import ROOT

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


def test_typed_contracts():
    """The network spec and the exploration travel as messages; unknown fields are refused, not dropped."""
    import numpy as np
    import pytest

    from rlfleet.proto import arrays, rlfleet_pb2

    msg = arrays.to_proto(3, {"q/w0": np.zeros((2, 2), np.float32)}, {"epsilon": 0.25})
    back = rlfleet_pb2.Weights.FromString(msg.SerializeToString())
    assert back.policy_version == 3 and back.exploration.epsilon == 0.25
    assert arrays.from_proto(back)[1].keys() == {"q/w0"}  # ε is not one of the arrays
    with pytest.raises(ValueError, match="Exploration"):
        arrays.to_proto(3, {}, {"temperature": 1.0})
    spec = rlfleet_pb2.NetworkSpec(observation_shape=[11], action_dim=3, action_low=[-1] * 3, action_high=[1] * 3)
    config = rlfleet_pb2.RunConfig(algo="ppo", network=spec)
    assert list(rlfleet_pb2.RunConfig.FromString(config.SerializeToString()).network.action_high) == [1.0] * 3
    # The retired JSON field's number stays reserved: nothing new may take field 8.
    assert 8 not in rlfleet_pb2.RunConfig.DESCRIPTOR.fields_by_number
    assert "network_json" not in rlfleet_pb2.RunConfig.DESCRIPTOR.fields_by_name
