"""One policy everywhere: for random settings, normalizer statistics and raw observations, the actors'
behaviour policy, the evaluator's policy and the learner's policy give the same action distribution.

The actors and the evaluator see the weights as they travel (through the `Weights` protobuf message);
the learner computes with its TensorFlow networks on its own normalizer. Any setting that shapes the
policy but did not travel with the weights (as `obs_clip` once did not) makes these differ.
"""

import numpy as np
import pytest
import tensorflow as tf

from rlfleet.algorithms.dqn.agent import DQNAgent
from rlfleet.algorithms.dqn.policy import epsilon_greedy, q_values
from rlfleet.algorithms.library.policy import mlp_forward
from rlfleet.algorithms.ppo.learning import BatchPPO
from rlfleet.algorithms.ppo.policy import mean_env_action, normalize_obs, sample_actions, to_env_action
from rlfleet.algorithms.settings import make_algo_config
from rlfleet.envs.core import EnvSpec
from rlfleet.proto import arrays as proto_arrays
from rlfleet.proto import rlfleet_pb2


def _through_the_wire(weights: dict) -> dict:
    """The arrays as an actor receives them: serialized into a `Weights` message and parsed back."""
    wire = proto_arrays.to_proto(7, weights).SerializeToString()
    return proto_arrays.from_proto(rlfleet_pb2.Weights.FromString(wire))[1]


def _perturb(variables, rng, scale):
    for v in variables:
        v.assign(v.numpy() + scale * rng.standard_normal(v.shape).astype(np.float32))


@pytest.mark.parametrize("case", range(12))
def test_ppo_actor_evaluator_and_learner_policies_agree(case):
    rng = np.random.default_rng(1000 + case)
    obs_dim, action_dim = int(rng.integers(1, 30)), int(rng.integers(1, 8))
    low = rng.uniform(-3, -0.1, action_dim)
    high = low + rng.uniform(0.2, 6, action_dim)
    spec = EnvSpec("Random-v0", (obs_dim,), "continuous", action_dim, tuple(low), tuple(high))
    settings = dict(
        obs_clip=float(rng.choice([0.5, 1.0, 3.0, 5.0, 10.0, 50.0])),
        policy_hidden=tuple(int(h) for h in rng.integers(4, 64, rng.integers(1, 4))),
        init_std=float(rng.uniform(0.05, 2.0)),
        mean_init_factor=float(rng.uniform(0.01, 2.0)),
        activation=str(rng.choice(["relu", "tanh"])),
        mean_head=str(rng.choice(["tanh", "linear"])),
        obs_normalization=bool(rng.random() < 0.75),
    )
    algo = BatchPPO(spec, make_algo_config("ppo", rng.choice(["default", "paper"]), spec.env_id, settings), seed=case)
    _perturb(algo.policy.trainable_variables, rng, 0.3)
    if settings["obs_normalization"]:  # as the learner does: statistics only when normalizing
        algo.obs_norm.update(
            rng.normal(
                rng.uniform(-5, 5, obs_dim), rng.uniform(0.01, 10, obs_dim), (int(rng.integers(2, 500)), obs_dim)
            )
        )
    raw = rng.normal(0, 1, (64, obs_dim)) * rng.choice([0.1, 1.0, 100.0], (64, obs_dim)) + algo.obs_norm.mean

    weights = _through_the_wire(algo.export_weights())
    learner_mean, learner_log_std = (x.numpy() for x in algo.policy(algo.obs_norm.normalize(raw)))
    _, _, actor_mean, actor_log_std = sample_actions(weights, raw, rng)
    # Both sides compute in float32, summing in their own orders: their rounding grows with the size of the
    # mean head's inputs (hundreds here when unnormalized observations of ~100 meet perturbed weights), so the
    # tolerance does too; a wrong normalization, activation or head would be off by far more.
    scale = float(np.abs(mlp_forward(weights, normalize_obs(weights, raw), "policy", settings["activation"])).max())
    atol = 2e-5 + 4 * float(np.finfo(np.float32).eps) * scale
    np.testing.assert_allclose(actor_mean, learner_mean, atol=atol)
    np.testing.assert_allclose(actor_log_std, learner_log_std, atol=1e-6)
    lo, hi = np.asarray(low, np.float32), np.asarray(high, np.float32)
    np.testing.assert_allclose(
        mean_env_action(weights, raw, lo, hi),
        to_env_action(learner_mean, lo, hi),
        atol=max(1e-4, atol) * float(np.max(hi - lo)),
    )


@pytest.mark.parametrize("case", range(6))
def test_dqn_actor_evaluator_and_learner_q_values_agree(case):
    rng = np.random.default_rng(2000 + case)
    obs_dim, actions = int(rng.integers(1, 12)), int(rng.integers(2, 7))
    spec = EnvSpec("Random-v0", (obs_dim,), "discrete", actions)
    hidden = tuple(int(h) for h in rng.integers(4, 64, rng.integers(1, 4)))
    agent = DQNAgent(spec, make_algo_config("dqn", "default", spec.env_id, dict(hidden=hidden)), seed=case)
    _perturb(agent.q.trainable_variables, rng, 0.3)
    raw = (rng.normal(0, 1, (64, obs_dim)) * rng.choice([0.1, 1.0, 100.0], (64, obs_dim))).astype(np.float32)
    weights = _through_the_wire(agent.export_weights())
    learner_q = agent.q(tf.constant(raw)).numpy()
    np.testing.assert_allclose(q_values(weights, raw), learner_q, rtol=1e-5, atol=1e-4)
    # with ε = 0 the behaviour policy (actors) and the evaluation policy (ε_eval) are the learner's greedy one
    np.testing.assert_array_equal(epsilon_greedy(weights, raw, rng, epsilon=0.0), learner_q.argmax(-1))
