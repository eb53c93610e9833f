"""The arithmetic count behind benchmarks/atari.py's learner ceiling, checked against TensorFlow's own count of
the Nature CNN's graph (the GFLOP per gradient step that the ceiling divides the CPU's matmul rate by)."""

import os
import sys

import tensorflow as tf
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

from rlfleet.learner.networks import NatureCNN

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import atari  # noqa: E402


def _profiled_flops(fn, spec) -> int:
    graph = convert_variables_to_constants_v2(tf.function(fn).get_concrete_function(spec)).graph
    options = tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
    options["output"] = "none"
    return tf.compat.v1.profiler.profile(graph, options=options).total_float_ops


def test_nature_cnn_forward_flops_match_tensorflows_count():
    net = NatureCNN(4, (84, 84), 6, 0, "q")
    counted = atari.nature_cnn_flops(net)
    profiled = _profiled_flops(net, tf.TensorSpec((1, 4, 84, 84), tf.uint8))
    # The profiler also counts biases, ReLUs and the frames' scaling, which the count leaves out (< 1%).
    assert counted["forward"] <= profiled <= 1.01 * counted["forward"]
    assert 2.5 * counted["forward"] < counted["forward_backward"] < 3 * counted["forward"]


def test_flops_follow_the_action_count():
    small, large = (atari.nature_cnn_flops(NatureCNN(4, (84, 84), a, 0, "q"))["forward"] for a in (2, 18))
    assert large - small == 2 * 512 * 16
