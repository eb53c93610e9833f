"""BatchPPO learner object without any server: presets, update, checkpoint round trip."""

import numpy as np
import pytest
import tensorflow as tf

from rlfleet.algorithms.ppo.config import make_config
from rlfleet.algorithms.ppo.learning import BatchPPO
from rlfleet.algorithms.ppo.policy import policy_mean, sample_actions
from rlfleet.envs.core import env_spec

SPEC = env_spec("InvertedPendulum-v5")


def make_batch(algo, t=16, n=4, seed=0):
    rng = np.random.default_rng(seed)
    obs = rng.standard_normal((t + 1, n, SPEC.obs_shape[0])).astype(np.float32)
    action, log_prob, mean, log_std = sample_actions(algo.export_weights(), obs.reshape(-1, obs.shape[-1]), rng)
    shape = lambda x: x.reshape(t + 1, n, *x.shape[1:])
    return dict(
        observation=obs,
        action=shape(action),
        reward=rng.standard_normal((t + 1, n)).astype(np.float32),
        terminated=rng.random((t + 1, n)) < 0.03,
        truncated=rng.random((t + 1, n)) < 0.03,
        final_observation=rng.standard_normal(obs.shape).astype(np.float32),
        discounted_return=rng.standard_normal((t + 1, n)).astype(np.float32),
        behaviour_log_prob=shape(log_prob),
        behaviour_mean=shape(mean),
        behaviour_log_std=shape(log_std),
        policy_version=np.zeros((t + 1, n), np.int64),
    )


def test_paper_preset_holds_the_reference_values():
    paper = make_config("paper", "Hopper-v5")
    assert (paper.learning_rate, paper.epochs, paper.batch_episodes, paper.kl_target) == (1e-4, 25, 30, 0.01)
    assert paper.policy_hidden == (200, 100) and paper.init_std == 0.35 and paper.discount == 0.995
    assert make_config("paper", "HalfCheetah-v5").discount == 0.99
    with pytest.raises(ValueError, match="unknown PPO setting"):
        make_config("default", "Hopper-v5", {"lr": 1.0})
    with pytest.raises(ValueError, match=r"policy_objective = 'clipped': choose one of \['kl_penalty', 'clip'\]"):
        make_config("default", "Hopper-v5", {"policy_objective": "clipped"})
    with pytest.raises(ValueError, match=r"max_importance_weight = 0.0: must be > 0"):
        make_config("default", "Hopper-v5", {"max_importance_weight": 0.0})
    from rlfleet.algorithms.settings import make_algo_config

    with pytest.raises(ValueError, match=r"QDAGGER does not use \['lr_schedule'\]"):
        make_algo_config("qdagger", "default", "CartPole-v1", {"lr_schedule": "linear"})
    with pytest.raises(ValueError, match=r"lr_final_fraction = 2.0: must be in \[0, 1\]"):
        make_algo_config("dqn", "default", "CartPole-v1", {"lr_final_fraction": 2.0})


@pytest.mark.parametrize("preset,objective", [("default", "kl_penalty"), ("default", "clip"), ("paper", "kl_penalty")])
def test_update_moves_policy_and_adapts_beta(preset, objective):
    cfg = make_config(preset, SPEC.env_id, {"epochs": 3, "policy_objective": objective})
    algo = BatchPPO(SPEC, cfg, seed=0)
    before = algo.export_weights()
    batch = make_batch(algo)
    metrics = algo.update(batch)
    after = algo.export_weights()
    assert metrics["gradient_steps"] == 3 * max(1, min(cfg.num_minibatches, 64))
    assert not np.allclose(before["policy/w0"], after["policy/w0"])
    assert metrics["kl"] > 0 and np.isfinite(metrics["policy_loss"]) and np.isfinite(metrics["value_loss"])
    expected_beta = (
        cfg.init_beta * 1.5
        if metrics["kl"] > 1.3 * cfg.kl_target
        else cfg.init_beta / 1.5
        if metrics["kl"] < 0.7 * cfg.kl_target
        else cfg.init_beta
    )
    if objective == "clip":  # β belongs to the KL-penalty objective: the clip objective leaves it alone
        expected_beta = cfg.init_beta
    assert metrics["beta"] == pytest.approx(expected_beta)
    # The observation normalizer has seen the batch and travels with the weights.
    np.testing.assert_allclose(after["obs_norm/mean"], batch["observation"][:-1].reshape(-1, 4).mean(0), rtol=1e-5)


@pytest.mark.parametrize(
    "schedule,final,progress,expected",
    [("linear", 0.0, 0.5, 1.5e-4), ("linear", 0.0, 1.0, 0.0), ("linear", 0.2, 1.0, 6e-5), ("constant", 0.2, 0.9, 3e-4)],
)
def test_learning_rate_schedule(schedule, final, progress, expected):
    cfg = make_config("default", SPEC.env_id, {"epochs": 1, "lr_schedule": schedule, "lr_final_fraction": final})
    algo = BatchPPO(SPEC, cfg, seed=0)
    metrics = algo.update(make_batch(algo), progress)
    assert metrics["learning_rate"] == pytest.approx(expected, rel=1e-5)


def test_checkpoint_round_trip(tmp_path):
    cfg = make_config("default", SPEC.env_id, {"epochs": 2})
    algo = BatchPPO(SPEC, cfg, seed=0)
    algo.update(make_batch(algo))
    algo.sync_to_checkpoint()
    path = tf.train.Checkpoint(**algo.checkpoint_items()).save(str(tmp_path / "ckpt"))

    other = BatchPPO(SPEC, cfg, seed=5)
    tf.train.Checkpoint(**other.checkpoint_items()).restore(path).assert_existing_objects_matched()
    other.sync_from_checkpoint()
    a, b = algo.export_weights(), other.export_weights()
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    assert other.beta == algo.beta and other.reward_norm.count == algo.reward_norm.count
    # Optimizer state came back too: one more identical update gives identical weights.
    batch = make_batch(algo, seed=1)
    other.rng = np.random.default_rng(7)
    algo.rng = np.random.default_rng(7)
    algo.update(batch)
    other.update(batch)
    np.testing.assert_allclose(algo.export_weights()["policy/w0"], other.export_weights()["policy/w0"], atol=1e-6)


def test_numpy_actor_policy_matches_tensorflow_policy():
    algo = BatchPPO(SPEC, make_config("default", SPEC.env_id), seed=3)
    algo.update(make_batch(algo))
    obs = np.random.default_rng(2).standard_normal((5, 4)).astype(np.float32)
    tf_mean, _ = algo.policy(algo.obs_norm.normalize(obs))
    np.testing.assert_allclose(policy_mean(algo.export_weights(), obs), tf_mean.numpy(), atol=1e-5)


def test_value_targets_bootstrap_at_truncation_not_at_termination():
    """One-step targets (λ = 0): r + γ·V(final observation) after a time limit, r after a terminal state."""
    cfg = make_config("default", SPEC.env_id, {"gae_lambda": 0.0})
    algo = BatchPPO(SPEC, cfg, seed=0)
    batch = make_batch(algo, t=8, n=3, seed=4)
    batch["terminated"][:] = False
    batch["truncated"][:] = False
    batch["truncated"][3, 0] = True  # env 0: time limit after step 3
    batch["terminated"][3, 1] = True  # env 1: terminal state after step 3
    algo.obs_norm.update(batch["observation"].reshape(-1, 4))
    algo.reward_norm.update(batch["reward"].reshape(-1))
    _, returns = algo.advantages(batch)
    r = algo.scale_rewards(batch["reward"][3, :2])
    v = lambda o: float(algo.value(algo.obs_norm.normalize(o[None]))[0])
    gamma = cfg.discount
    assert returns[3, 0].numpy() == pytest.approx(r[0] + gamma * v(batch["final_observation"][3, 0]), rel=1e-5)
    assert returns[3, 1].numpy() == pytest.approx(r[1], rel=1e-5)
    # env 2 continues: bootstraps from the next observation
    r2 = algo.scale_rewards(batch["reward"][3, 2:3])[0]
    assert returns[3, 2].numpy() == pytest.approx(r2 + gamma * v(batch["observation"][4, 2]), rel=1e-5)
    # the final observation matters only where truncated
    other = dict(batch, final_observation=batch["final_observation"] + 3.0)
    _, returns2 = algo.advantages(other)
    assert returns2[3, 0].numpy() != pytest.approx(returns[3, 0].numpy())
    np.testing.assert_allclose(np.delete(returns2.numpy().ravel(), 3 * 3), np.delete(returns.numpy().ravel(), 3 * 3))


@pytest.mark.parametrize("mode", ["rms", "return", "none"])
def test_reward_scale_modes(mode):
    """rms: ÷ RMS of the rewards (BatchPPO); return: ÷ std of the actors' discounted returns; none: raw."""
    cfg = make_config("default", SPEC.env_id, {"reward_scale": mode, "reward_clip": 3.0})
    algo = BatchPPO(SPEC, cfg, seed=0)
    batch = make_batch(algo, t=8, n=3, seed=5)
    batch["reward"] = batch["reward"] * 4.0
    batch["discounted_return"] = batch["discounted_return"] * 10.0 + 7.0
    algo.update(batch)
    r = batch["reward"][:-1]
    got = algo.scale_rewards(r)
    if mode == "none":
        np.testing.assert_allclose(got, r)
    else:
        tracked = (r if mode == "rms" else batch["discounted_return"][:-1]).reshape(-1)
        divisor = np.sqrt(np.mean(tracked**2) + 1e-8) if mode == "rms" else np.sqrt(np.var(tracked) + 1e-8)
        np.testing.assert_allclose(got, np.clip(r / divisor, -3.0, 3.0), rtol=1e-4, atol=1e-6)


def test_cleanrl_preset_and_its_update():
    """The `cleanrl` preset's details (CleanRL's ppo_continuous_action.py) and one update with them: orthogonal
    layers with CleanRL's gains, one Adam (ε 1e-5) stepping both networks, the diagnostics CleanRL logs."""
    cfg = make_config("cleanrl", SPEC.env_id)
    assert (cfg.init, cfg.adam_epsilon, cfg.shared_optimizer, cfg.value_clip, cfg.advantage_norm) == (
        "orthogonal",
        1e-5,
        True,
        0.2,
        "minibatch",
    )
    assert (cfg.obs_clip, cfg.reward_scale, cfg.reward_clip, cfg.lr_schedule, cfg.lr_final_fraction) == (
        10.0,
        "return",
        10.0,
        "linear",
        0.0,
    )
    assert cfg.envs_per_actor * cfg.unroll_length == cfg.batch_env_steps == 2048 and cfg.num_minibatches == 32
    algo = BatchPPO(SPEC, cfg, seed=0)
    hidden = algo.policy.mlp.kernels[0].numpy()  # [obs_dim, 64]: orthonormal columns times √2
    gram = hidden @ hidden.T if hidden.shape[0] < hidden.shape[1] else hidden.T @ hidden
    np.testing.assert_allclose(gram, 2.0 * np.eye(min(hidden.shape)), atol=1e-5)
    head = algo.policy.mlp.kernels[-1].numpy()  # [64, A]: gain 0.01
    np.testing.assert_allclose(head.T @ head, 1e-4 * np.eye(head.shape[1]), atol=1e-9)
    assert algo.policy_opt.epsilon == pytest.approx(1e-5)
    value_before = algo.value.mlp.kernels[0].numpy().copy()
    policy_before = algo.export_weights()["policy/w0"].copy()
    metrics = algo.update(make_batch(algo, t=64, n=4), progress=0.5)
    assert not np.allclose(value_before, algo.value.mlp.kernels[0].numpy())  # the one optimizer stepped both
    assert not np.allclose(policy_before, algo.export_weights()["policy/w0"])
    assert algo.value_opt.iterations.numpy() == 0 and algo.policy_opt.iterations.numpy() == metrics["gradient_steps"]
    assert metrics["learning_rate"] == pytest.approx(1.5e-4)
    assert 0.0 <= metrics["clip_fraction"] <= 1.0 and metrics["approx_kl"] >= 0.0
    assert metrics["explained_variance"] <= 1.0 and np.isfinite(metrics["entropy"])
    assert metrics["max_importance_weight"] >= metrics["mean_importance_weight"] > 0


@pytest.mark.slow
def test_off_policy_objective_anchors_the_ratio_at_the_learner_or_the_behaviour_policy():
    """On-policy data: both objectives are one update. Data whose behaviour policy gave every action e times less
    probability than the learner's: the decoupled objective's ratio starts at 1 (anchor: the learner's policy) and
    weights samples by π_proximal/π_behaviour = e truncated to max_importance_weight; the behaviour objective's
    ratio starts at e, outside the clip range for every sample, with weights of 1; the uncorrected one's ratio
    starts at 1, with weights of 1."""
    cfg = {"epochs": 1, "num_minibatches": 1, "policy_objective": "clip", "max_importance_weight": 2.0}
    algos = {
        o: BatchPPO(SPEC, make_config("default", SPEC.env_id, dict(cfg, off_policy_objective=o)), seed=0)
        for o in ("decoupled", "behaviour")
    }
    on_policy = make_batch(algos["decoupled"])
    for algo in algos.values():
        algo.update(on_policy)
    a, b = (algos[o].export_weights() for o in ("decoupled", "behaviour"))
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=1e-5, atol=1e-6)

    off_policy = dict(on_policy, behaviour_log_prob=on_policy["behaviour_log_prob"] - 1.0)
    decoupled, behaviour, uncorrected = (
        BatchPPO(SPEC, make_config("default", SPEC.env_id, dict(cfg, off_policy_objective=o)), seed=0).update(
            off_policy
        )
        for o in ("decoupled", "behaviour", "uncorrected")
    )
    assert decoupled["clip_fraction"] == 0.0 and decoupled["mean_importance_weight"] == pytest.approx(2.0)
    assert behaviour["clip_fraction"] == 1.0 and behaviour["mean_importance_weight"] == 1.0
    assert uncorrected["clip_fraction"] == 0.0 and uncorrected["mean_importance_weight"] == 1.0
    with pytest.raises(ValueError, match="off_policy_objective=behaviour needs policy_objective=clip"):
        make_config("default", SPEC.env_id, {"off_policy_objective": "behaviour", "policy_objective": "kl_penalty"})


@pytest.mark.slow
def test_advantage_traces_change_nothing_on_policy_and_something_off_policy():
    cfg = {"epochs": 1, "num_minibatches": 1}
    make = lambda traces: BatchPPO(
        SPEC, make_config("default", SPEC.env_id, dict(cfg, advantage_traces=traces)), seed=0
    )
    on_policy = make_batch(make("none"))
    shifted = dict(on_policy, behaviour_log_prob=on_policy["behaviour_log_prob"] + 0.7)  # pi/mu = 0.5: traces cut
    for batch, same in ((on_policy, True), (shifted, False)):
        plain, traced = make("none"), make("ratio")
        plain.update(batch)
        traced.update(batch)
        a, b = plain.export_weights(), traced.export_weights()
        assert all(np.allclose(a[k], b[k], rtol=1e-5, atol=1e-6) for k in a) is same


@pytest.mark.slow
def test_target_kl_stops_an_update_once_the_policy_has_moved_far_enough():
    """The same batch and start: without target_kl every gradient step runs; with a target smaller than any step's
    KL, only the first (always taken) runs; with a middling one the update stops part-way and ends closer to where
    it started."""
    cfg = {"epochs": 10, "num_minibatches": 4}
    runs = {}
    for target in (0.0, 1e-9, 1e-4):
        algo = BatchPPO(SPEC, make_config("cleanrl", SPEC.env_id, dict(cfg, target_kl=target)), seed=0)
        runs[target] = algo.update(make_batch(algo, t=64, n=4, seed=1))
    assert runs[0.0]["gradient_steps"] == 40
    assert runs[1e-9]["gradient_steps"] == 1
    assert 1 < runs[1e-4]["gradient_steps"] < 40
    assert runs[1e-9]["kl"] < runs[1e-4]["kl"] < runs[0.0]["kl"]
    # The stop measures the KL from the update's start, not from the ratio's anchor: with the behaviour policy as
    # the anchor and every action e times likelier under the learner's policy, the first step is taken as ever.
    algo = BatchPPO(
        SPEC, make_config("cleanrl", SPEC.env_id, dict(cfg, target_kl=1e-9, off_policy_objective="behaviour")), seed=0
    )
    batch = make_batch(algo, t=64, n=4, seed=1)
    off_policy = algo.update(dict(batch, behaviour_log_prob=batch["behaviour_log_prob"] - 1.0))
    assert off_policy["gradient_steps"] == 1 and off_policy["approx_kl"] > 0.1
    with pytest.raises(ValueError, match=r"target_kl = -0.01: must be >= 0"):
        make_config("cleanrl", SPEC.env_id, {"target_kl": -0.01})
