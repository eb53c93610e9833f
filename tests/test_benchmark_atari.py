"""The arithmetic count behind benchmarks/atari.py's learner ceiling, checked against TensorFlow's own count of
the Nature CNN's graph (the GFLOP per gradient step that the ceiling divides the CPU's matmul rate by)."""

import os
import sys

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

from rlfleet.algorithms.dqn.networks import CNN

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import atari  # noqa: E402


def _profiled_flops(fn, spec) -> int:
    graph = convert_variables_to_constants_v2(tf.function(fn).get_concrete_function(spec)).graph
    options = tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
    options["output"] = "none"
    return tf.compat.v1.profiler.profile(graph, options=options).total_float_ops


def test_nature_cnn_forward_flops_match_tensorflows_count():
    net = CNN("nature_cnn", 4, (84, 84), 6, 0, "q")
    counted = atari.nature_cnn_flops(net)
    profiled = _profiled_flops(net, tf.TensorSpec((1, 4, 84, 84), tf.uint8))
    # The profiler also counts biases, ReLUs and the frames' scaling, which the count leaves out (< 1%).
    assert counted["forward"] <= profiled <= 1.01 * counted["forward"]
    assert 2.5 * counted["forward"] < counted["forward_backward"] < 3 * counted["forward"]


def test_flops_follow_the_action_count():
    small, large = (atari.nature_cnn_flops(CNN("nature_cnn", 4, (84, 84), a, 0, "q"))["forward"] for a in (2, 18))
    assert large - small == 2 * 512 * 16


def test_bfloat16_forward_pass_follows_the_float32_one():
    from rlfleet.algorithms.dqn.policy import nature_cnn_q

    net = CNN("nature_cnn", 4, (84, 84), 6, 0, "q")
    frames = tf.constant(np.random.default_rng(1).integers(0, 255, (64, 4, 84, 84), dtype=np.uint8))
    weights = (net.conv_kernels, net.conv_biases, net.kernels, net.biases)
    q32 = net(frames).numpy()
    q16 = nature_cnn_q(frames, *[[tf.cast(v, tf.bfloat16) for v in vs] for vs in weights])
    assert q16.dtype == tf.float32
    # bfloat16 keeps 8 bits of mantissa: the Q-values agree to a few percent of their spread.
    np.testing.assert_allclose(q16.numpy(), q32, atol=0.05 * np.abs(q32).max())


def test_actor_budget_splits_the_time_an_actor_is_allowed():
    forward = {"forward_ms": 4.0, "forward_bfloat16_ms": 2.0}
    b = atari.actor_budget(raw=5000.0, written=1250.0, forward=forward, num_envs=20)
    assert b["env_us"] == 200.0 and b["allowed_us"] == pytest.approx(1e6 / 3000) and b["actor_us"] == 800.0
    assert b["left_us"] == pytest.approx(1e6 / 3000 - 200.0)
    assert (b["forward_us"], b["forward_bfloat16_us"]) == (200.0, 100.0)
