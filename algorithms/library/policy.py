"""The numpy pieces that the algorithms' behaviour policies share, as the actors run them on weights pushed by
the learner.

MLPs run as plain numpy: a 200-100 MLP on a batch of 16 costs a few tens of µs as numpy matrix products, about
twenty times less than one `tf.function` call (benchmarks: the throughput page). Each algorithm's own policy
(`rlfleet.algorithms.<name>.policy`) builds on these.
"""

from __future__ import annotations

import numpy as np

ACTIVATIONS = ("relu", "tanh")  # hidden-layer activations an MLP may have (an index travels with the weights)


def scalar_code(arrays: dict, key: str) -> int:
    """A small integer that travels with the weights as a [1] (or scalar) float array, e.g. an index into
    `ACTIVATIONS`."""
    return int(np.ravel(arrays[key])[0])


def mlp_forward(arrays: dict, x: np.ndarray, prefix: str = "policy", activation: str = "relu") -> np.ndarray:
    """MLP on the layers `{prefix}/w{i}`, `{prefix}/b{i}`: `activation` ("relu" or "tanh") on all but the last."""
    act = np.tanh if activation == "tanh" else (lambda z: np.maximum(z, 0.0))
    h, i = x, 0
    while f"{prefix}/w{i + 1}" in arrays:
        h = act(h @ arrays[f"{prefix}/w{i}"] + arrays[f"{prefix}/b{i}"])
        i += 1
    return h @ arrays[f"{prefix}/w{i}"] + arrays[f"{prefix}/b{i}"]
