import numpy as np
import pytest
import tensorflow as tf

from rlfleet.algorithms.library.normalizer import RunningMeanStd
from rlfleet.algorithms.ppo import losses as ppo_math


def np_log_prob(mean, log_std, x):
    std = np.exp(log_std)
    return np.sum(-0.5 * ((x - mean) / std) ** 2 - log_std - 0.5 * np.log(2 * np.pi), axis=-1)


def np_kl(mp, lsp, mq, lsq):
    sp, sq = np.exp(lsp), np.exp(lsq)
    return np.sum(np.log(sq / sp) + (sp**2 + (mp - mq) ** 2) / (2 * sq**2) - 0.5, axis=-1)


# ---------------------------------------------------------------- Gaussians


def test_log_prob_matches_numpy():
    rng = np.random.default_rng(0)
    mean = rng.normal(size=(5, 3)).astype(np.float32)
    log_std = rng.normal(scale=0.3, size=(3,)).astype(np.float32)
    x = rng.normal(size=(5, 3)).astype(np.float32)
    got = ppo_math.gaussian_log_prob(mean, log_std, x).numpy()
    assert got.shape == (5,)
    np.testing.assert_allclose(got, np_log_prob(mean, log_std, x), rtol=1e-5, atol=1e-5)


def test_log_prob_standard_normal_at_zero():
    got = ppo_math.gaussian_log_prob(
        np.zeros((1, 2), np.float32), np.zeros(2, np.float32), np.zeros((1, 2), np.float32)
    ).numpy()
    np.testing.assert_allclose(got, [-np.log(2 * np.pi)], rtol=1e-6)


def test_entropy():
    log_std = np.array([[0.1, -0.5, 0.3], [0.0, 0.0, 0.0]], np.float32)
    got = ppo_math.gaussian_entropy(log_std).numpy()
    want = np.sum(log_std + 0.5 * np.log(2 * np.pi * np.e), axis=-1)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_kl_matches_closed_form_numpy():
    rng = np.random.default_rng(1)
    mp, mq = rng.normal(size=(2, 7, 4)).astype(np.float32)
    lsp, lsq = rng.normal(scale=0.5, size=(2, 7, 4)).astype(np.float32)
    got = ppo_math.gaussian_kl(mp, lsp, mq, lsq).numpy()
    assert got.shape == (7,)
    np.testing.assert_allclose(got, np_kl(mp, lsp, mq, lsq), rtol=1e-5, atol=1e-6)
    assert np.all(got >= 0)


def test_kl_self_is_zero_and_broadcast_log_std():
    rng = np.random.default_rng(2)
    m = rng.normal(size=(6, 3)).astype(np.float32)
    ls = np.array([0.2, -0.4, 0.1], np.float32)
    got = ppo_math.gaussian_kl(m, ls, m, ls).numpy()
    assert got.shape == (6,)
    np.testing.assert_allclose(got, np.zeros(6), atol=1e-6)


def test_kl_monte_carlo():
    rng = np.random.default_rng(3)
    mp = np.array([0.3, -0.2], np.float32)
    lsp = np.array([-0.3, 0.1], np.float32)
    mq = np.array([0.0, 0.4], np.float32)
    lsq = np.array([0.0, -0.2], np.float32)
    n = 200000
    x = (mp + np.exp(lsp) * rng.normal(size=(n, 2))).astype(np.float32)
    lp = ppo_math.gaussian_log_prob(np.broadcast_to(mp, x.shape), lsp, x)
    lq = ppo_math.gaussian_log_prob(np.broadcast_to(mq, x.shape), lsq, x)
    mc = float(tf.reduce_mean(lp - lq))
    exact = float(ppo_math.gaussian_kl(mp, lsp, mq, lsq))
    assert exact > 0.1
    assert abs(mc - exact) < 0.02


# ---------------------------------------------------------------- adaptive beta


def test_adapt_kl_beta():
    t = 0.01
    assert ppo_math.adapt_kl_beta(1.0, 0.02, t) == pytest.approx(1.5)
    assert ppo_math.adapt_kl_beta(1.0, 0.0131, t) == pytest.approx(1.5)
    assert ppo_math.adapt_kl_beta(1.0, 0.005, t) == pytest.approx(1 / 1.5)
    assert ppo_math.adapt_kl_beta(1.0, 0.0069, t) == pytest.approx(1 / 1.5)
    for kl in (0.0071, 0.01, 0.0129):
        assert ppo_math.adapt_kl_beta(1.0, kl, t) == 1.0
    # clipping
    assert ppo_math.adapt_kl_beta(900.0, 1.0, t) == 1e3
    assert ppo_math.adapt_kl_beta(1.2e-4, 0.0, t) == 1e-4
    # numpy floats in, python float out
    out = ppo_math.adapt_kl_beta(np.float32(2.0), np.float64(0.1), np.float32(t))
    assert isinstance(out, float) and out == pytest.approx(3.0)


# ---------------------------------------------------------------- policy loss


def test_kl_cutoff_zero_below_threshold():
    n = 4
    zeros = np.zeros(n, np.float32)
    kl = np.full(n, 0.02, np.float32)  # mean kl == 2 * target exactly
    loss, info = ppo_math.ppo_kl_penalty_loss(zeros, zeros, zeros, kl, beta=1.0, kl_target=0.01)
    assert float(info["kl_cutoff"]) == 0.0
    np.testing.assert_allclose(float(info["kl_penalty"]), 0.02, rtol=1e-6)
    np.testing.assert_allclose(float(loss), 0.02, rtol=1e-6)


def test_kl_cutoff_above_threshold():
    zeros = np.zeros(4, np.float32)
    kl = np.array([0.02, 0.04, 0.06, 0.08], np.float32)  # mean 0.05
    loss, info = ppo_math.ppo_kl_penalty_loss(zeros, zeros, zeros, kl, beta=2.0, kl_target=0.01)
    # 1000 * (0.05 - 0.02)^2 = 0.9 ; penalty 2 * 0.05 = 0.1
    np.testing.assert_allclose(float(info["kl_cutoff"]), 0.9, rtol=1e-4)
    np.testing.assert_allclose(float(info["kl_penalty"]), 0.1, rtol=1e-5)
    np.testing.assert_allclose(float(info["mean_kl"]), 0.05, rtol=1e-5)
    np.testing.assert_allclose(float(info["surrogate"]), 0.0, atol=1e-7)
    np.testing.assert_allclose(float(loss), 1.0, rtol=1e-4)


def _policy_setup(seed=4, n=16, a=2):
    rng = np.random.default_rng(seed)
    mu_beh = rng.normal(size=(n, a)).astype(np.float32)
    ls_beh = np.array([-0.5, -0.2], np.float32)
    mu_new = (mu_beh + 0.3 * rng.normal(size=(n, a))).astype(np.float32)
    ls_new = np.array([-0.4, -0.3], np.float32)
    acts = (mu_beh + np.exp(ls_beh) * rng.normal(size=(n, a))).astype(np.float32)
    adv = rng.normal(size=n).astype(np.float32)
    return mu_beh, ls_beh, mu_new, ls_new, acts, adv


def test_importance_ratio_surrogate_and_gradient():
    mu_beh, ls_beh, mu_new, ls_new, acts, adv = _policy_setup()
    n = len(adv)
    beta, target = 0.5, 0.01

    mu_var = tf.Variable(mu_new)
    with tf.GradientTape() as tape:
        logp = ppo_math.gaussian_log_prob(mu_var, ls_new, acts)
        logp_beh = ppo_math.gaussian_log_prob(mu_beh, ls_beh, acts)
        kl = ppo_math.gaussian_kl(mu_beh, ls_beh, mu_var, ls_new)
        loss, info = ppo_math.ppo_kl_penalty_loss(logp, logp_beh, adv, kl, beta, target)
    grad = tape.gradient(loss, mu_var).numpy()

    # surrogate by hand
    lp_new = np_log_prob(mu_new, ls_new, acts)
    lp_beh = np_log_prob(mu_beh, ls_beh, acts)
    ratio = np.exp(lp_new - lp_beh)
    assert not np.allclose(ratio, 1.0)
    np.testing.assert_allclose(float(info["surrogate"]), -np.mean(ratio * adv), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(float(info["mean_ratio"]), ratio.mean(), rtol=1e-4)
    kl_np = np_kl(mu_beh, ls_beh, mu_new, ls_new)
    excess = max(0.0, kl_np.mean() - 2 * target)
    assert excess > 0  # cutoff active, so its gradient is exercised too
    want_loss = -np.mean(ratio * adv) + beta * kl_np.mean() + 1000 * excess**2
    np.testing.assert_allclose(float(loss), want_loss, rtol=1e-4)

    # hand-derived gradient w.r.t. the current mean
    var_new = np.exp(2 * ls_new)
    dlogp = (acts - mu_new) / var_new  # d logp / d mu
    dkl = (mu_new - mu_beh) / var_new  # d kl / d mu
    want_grad = -(ratio * adv)[:, None] * dlogp / n + (beta + 2000 * excess) * dkl / n
    assert np.all(np.isfinite(grad))
    np.testing.assert_allclose(grad, want_grad, rtol=1e-3, atol=1e-5)


def test_ppo_loss_in_tf_function():
    mu_beh, ls_beh, mu_new, ls_new, acts, adv = _policy_setup(seed=5)

    @tf.function
    def f(mu):
        logp = ppo_math.gaussian_log_prob(mu, ls_new, acts)
        logp_beh = ppo_math.gaussian_log_prob(mu_beh, ls_beh, acts)
        kl = ppo_math.gaussian_kl(mu_beh, ls_beh, mu, ls_new)
        return ppo_math.ppo_kl_penalty_loss(logp, logp_beh, adv, kl, tf.constant(1.0), 0.01)

    loss_graph, _ = f(tf.constant(mu_new))
    logp = ppo_math.gaussian_log_prob(mu_new, ls_new, acts)
    logp_beh = ppo_math.gaussian_log_prob(mu_beh, ls_beh, acts)
    kl = ppo_math.gaussian_kl(mu_beh, ls_beh, mu_new, ls_new)
    loss_eager, _ = ppo_math.ppo_kl_penalty_loss(logp, logp_beh, adv, kl, 1.0, 0.01)
    np.testing.assert_allclose(float(loss_graph), float(loss_eager), rtol=1e-5)


def test_value_loss():
    v = np.array([1.0, 2.0, 3.0], np.float32)
    r = np.array([1.0, 0.0, 4.0], np.float32)
    np.testing.assert_allclose(float(ppo_math.value_loss(v, r)), 0.5 * (0 + 4 + 1) / 3, rtol=1e-6)


# ---------------------------------------------------------------- returns / GAE

REWARDS = np.array([[1, 1], [2, 1], [3, 1], [4, 1]], np.float32)
DONES = np.array([[0, 0], [1, 0], [0, 0], [0, 1]], np.float32)  # all terminations here
BOOT = np.array([10.0, 5.0], np.float32)
GAMMA = 0.9
NO_TRUNC = np.zeros((4, 2), bool)
# column 0: done after t=1, bootstrap 10 -> R3=13, R2=14.7, R1=2, R0=2.8
# column 1: done after t=3 (bootstrap ignored) -> 1, 1.9, 2.71, 3.439
EXPECTED_RETURNS = np.array([[2.8, 3.439], [2.0, 2.71], [14.7, 1.9], [13.0, 1.0]], np.float32)


def _next(values, truncated=NO_TRUNC, truncation_values=None):
    tv = np.zeros_like(values) if truncation_values is None else truncation_values
    return ppo_math.next_state_values(values, BOOT, truncated, tv)


def test_discounted_returns_hand_computed():
    nv = _next(np.zeros((4, 2), np.float32))
    got = ppo_math.discounted_returns(REWARDS, nv, DONES, DONES, GAMMA).numpy()
    np.testing.assert_allclose(got, EXPECTED_RETURNS, rtol=1e-6)
    got_bool = ppo_math.discounted_returns(REWARDS, nv, DONES.astype(bool), DONES.astype(bool), GAMMA).numpy()
    np.testing.assert_allclose(got_bool, EXPECTED_RETURNS, rtol=1e-6)


def test_gae_lambda_one_is_return_minus_value():
    values = np.array([[0.5, -1.0], [2.0, 0.3], [1.0, 0.7], [3.0, 0.2]], np.float32)
    adv, ret = ppo_math.gae_advantages(REWARDS, values, _next(values), DONES, DONES, GAMMA, 1.0)
    np.testing.assert_allclose(adv.numpy(), EXPECTED_RETURNS - values, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret.numpy(), EXPECTED_RETURNS, rtol=1e-5)


def test_gae_lambda_zero_is_td_error():
    rng = np.random.default_rng(6)
    values = rng.normal(size=(4, 2)).astype(np.float32)
    adv, ret = ppo_math.gae_advantages(
        REWARDS, values, _next(values), DONES.astype(bool), DONES.astype(bool), GAMMA, 0.0
    )
    next_v = np.concatenate([values[1:], BOOT[None]], axis=0)
    td = REWARDS + GAMMA * (1 - DONES) * next_v - values
    np.testing.assert_allclose(adv.numpy(), td, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ret.numpy(), td + values, rtol=1e-5, atol=1e-6)


def test_traced_gae_is_gae_on_policy_and_weights_later_steps_by_truncated_ratios():
    rng = np.random.default_rng(7)
    values = rng.normal(size=(4, 2)).astype(np.float32)
    nv, lam = _next(values), 0.9
    gae, gae_ret = ppo_math.gae_advantages(REWARDS, values, nv, DONES, DONES, GAMMA, lam)
    adv, targets = ppo_math.traced_gae_advantages(
        REWARDS, values, nv, DONES, DONES, GAMMA, lam, ppo_math.truncated_ratios(np.zeros((4, 2)))
    )
    np.testing.assert_allclose(adv.numpy(), gae.numpy(), rtol=1e-6)  # pi = mu: GAE itself
    np.testing.assert_allclose(targets.numpy(), gae_ret.numpy(), rtol=1e-6)

    ratios = np.array([[0.5, 3.0], [2.0, 0.25], [0.8, 1.0], [1.5, 0.1]], np.float32)  # pi / mu per step
    adv, targets = ppo_math.traced_gae_advantages(
        REWARDS, values, nv, DONES, DONES, GAMMA, lam, ppo_math.truncated_ratios(np.log(ratios), max_ratio=1.0)
    )
    c = np.minimum(ratios, 1.0)
    delta = REWARDS + GAMMA * (1 - DONES) * nv - values
    expected = np.zeros_like(values)
    later = np.zeros(2, np.float32)
    for t in reversed(range(4)):  # the trace of step t + 1 carries A_{t+1} back; V(obs_T) closes the item
        c_next = c[t + 1] if t + 1 < 4 else np.ones(2, np.float32)
        expected[t] = delta[t] + GAMMA * lam * (1 - DONES[t]) * c_next * later
        later = expected[t]
    np.testing.assert_allclose(adv.numpy(), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(targets.numpy(), values + c * expected, rtol=1e-5, atol=1e-6)


def test_gae_in_tf_function():
    values = np.zeros((4, 2), np.float32)
    f = tf.function(lambda r, v, nv, d: ppo_math.gae_advantages(r, v, nv, d, d, GAMMA, 1.0))
    adv, _ = f(REWARDS, values, _next(values), DONES)
    np.testing.assert_allclose(adv.numpy(), EXPECTED_RETURNS, rtol=1e-5)


@pytest.mark.parametrize("lambda_", [0.0, 0.95, 1.0])
def test_truncation_bootstraps_from_the_final_observation_termination_does_not(lambda_):
    """A rollout that ends by a time limit vs the same rollout ending in a terminal state.

    Column 0 is truncated after t=1 with V(final observation) = 7, column 1
    is terminated after t=1; both start a new episode at t=2 (values there
    must not leak back across the boundary).
    """
    rewards = np.array([[1, 1], [1, 1], [5, 5], [5, 5]], np.float32)
    values = np.array([[2.0, 2.0], [3.0, 3.0], [-40.0, -40.0], [-50.0, -50.0]], np.float32)
    truncated = np.array([[0, 0], [1, 0], [0, 0], [0, 0]], bool)
    terminated = np.array([[0, 0], [0, 1], [0, 0], [0, 0]], bool)
    ends = truncated | terminated
    trunc_v = np.zeros((4, 2), np.float32)
    trunc_v[1, 0] = 7.0
    nv = ppo_math.next_state_values(values, BOOT, truncated, trunc_v).numpy()
    assert nv[1, 0] == 7.0 and nv[1, 1] == -40.0  # column 1's next value is ignored (terminal)
    adv, ret = ppo_math.gae_advantages(rewards, values, nv, terminated, ends, GAMMA, lambda_)
    adv, ret = adv.numpy(), ret.numpy()
    # one-step TD errors at the episode's last step
    np.testing.assert_allclose(adv[1], [1 + GAMMA * 7.0 - 3.0, 1 - 3.0], rtol=1e-6)
    # the first step of the episode: A_0 = δ_0 + γλ A_1, never reaching into the next episode
    for col in range(2):
        d0 = 1 + GAMMA * 3.0 - 2.0
        np.testing.assert_allclose(adv[0, col], d0 + GAMMA * lambda_ * adv[1, col], rtol=1e-5, atol=1e-6)
    if lambda_ == 1.0:  # returns = discounted returns bootstrapped at the truncation only
        want = ppo_math.discounted_returns(rewards, nv, terminated, ends, GAMMA).numpy()
        np.testing.assert_allclose(ret, want, rtol=1e-5)
        np.testing.assert_allclose(want[:2, 0], [1 + GAMMA * (1 + GAMMA * 7.0), 1 + GAMMA * 7.0], rtol=1e-6)
        np.testing.assert_allclose(want[:2, 1], [1 + GAMMA, 1.0], rtol=1e-6)


def test_normalize_advantages():
    x = np.array([[1.0, 2.0], [3.0, 6.0]], np.float32)
    got = ppo_math.normalize_advantages(x).numpy()
    want = (x - x.mean()) / (x.std() + 1e-8)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert abs(got.mean()) < 1e-6 and abs(got.std() - 1) < 1e-5


# ---------------------------------------------------------------- RunningMeanStd


def test_running_mean_std_matches_numpy_stream():
    rng = np.random.default_rng(7)
    rms = RunningMeanStd((3,))
    seen = []
    for size in (1, 5, 1, 17, 2, 100, 1, 33):
        batch = rng.normal(loc=[1.0, -2.0, 5.0], scale=[0.5, 3.0, 1.0], size=(size, 3))
        rms.update(batch)
        seen.append(batch)
        allx = np.concatenate(seen)
        assert rms.count == float(len(allx))
        np.testing.assert_allclose(rms.mean, allx.mean(0), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(rms.var, allx.var(0), rtol=1e-10, atol=1e-12)
    assert rms.mean.dtype == np.float64 and rms.var.dtype == np.float64
    np.testing.assert_allclose(rms.std, np.sqrt(allx.var(0) + 1e-8))


def test_normalize_before_update_and_clipping():
    rms = RunningMeanStd((2,), clip=5.0)
    x = np.array([[3.0, -9.0]])
    out = rms.normalize(x)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [[3.0, -5.0]])
    rms.update(np.array([[0.0, 0.0], [2.0, 2.0]]))  # mean 1, std ~1
    out = rms.normalize(np.array([[1.0, 100.0], [3.0, -100.0]]))
    np.testing.assert_allclose(out, [[0.0, 5.0], [2.0, -5.0]], rtol=1e-6)


def test_reward_mode_only_scales():
    rng = np.random.default_rng(8)
    rms = RunningMeanStd((), center=False, clip=10.0)
    r = rng.normal(loc=3.0, scale=2.0, size=50)
    rms.update(r)
    x = np.array([1.0, -2.0, 4.0])
    np.testing.assert_allclose(rms.normalize(x), x / np.sqrt(r.var() + r.mean() ** 2 + 1e-8), rtol=1e-6)
    assert rms.normalize(np.array([1e6]))[0] == 10.0
    constant = RunningMeanStd((), center=False, clip=10.0)
    constant.update(np.ones(100))
    np.testing.assert_allclose(constant.normalize(np.ones(3)), 1.0, rtol=1e-6)


def test_nan_input_raises_and_keeps_state():
    rms = RunningMeanStd((2,))
    rms.update(np.array([[1.0, 2.0], [3.0, 4.0]]))
    before = rms.state_dict()
    for bad in (np.array([[np.nan, 1.0]]), np.array([[1.0, np.inf]])):
        with pytest.raises(ValueError, match="non-finite"):
            rms.update(bad)
    after = rms.state_dict()
    for k in before:
        np.testing.assert_array_equal(before[k], after[k])


def test_shape_mismatch_raises():
    rms = RunningMeanStd((3,))
    with pytest.raises(ValueError, match=r"\(3,\).*\(4, 2\)"):
        rms.update(np.zeros((4, 2)))


def test_state_dict_round_trip():
    rng = np.random.default_rng(9)
    rms = RunningMeanStd((2,), clip=5.0)
    rms.update(rng.normal(size=(10, 2)))
    sd = rms.state_dict()
    assert sd["count"].dtype == np.float64 and sd["count"].shape == ()
    other = RunningMeanStd((2,), clip=5.0)
    other.load_state_dict(sd)
    assert other.count == rms.count
    np.testing.assert_array_equal(other.mean, rms.mean)
    np.testing.assert_array_equal(other.var, rms.var)
    x = rng.normal(size=(4, 2))
    np.testing.assert_array_equal(other.normalize(x), rms.normalize(x))
    # continued updates agree
    y = rng.normal(size=(3, 2))
    rms.update(y)
    other.update(y)
    np.testing.assert_allclose(other.mean, rms.mean)
    with pytest.raises(ValueError, match="mean"):
        RunningMeanStd((3,)).load_state_dict(sd)


# ---------------------------------------------------------------- clip objective / decoupled proximal policy


def test_ppo_clip_loss_hand_computed_and_weighted():
    log_prob = np.log(np.array([1.5, 0.5, 1.1, 0.7], np.float32))  # ratios to the proximal policy
    adv = np.array([1.0, 1.0, -2.0, -1.0], np.float32)
    # min(r A, clip(r, 0.8, 1.2) A): 1.2, 0.5, -2.2, -0.8
    loss, info = ppo_math.ppo_clip_loss(log_prob, np.zeros(4, np.float32), adv, 0.2)
    np.testing.assert_allclose(float(loss), -np.mean([1.2, 0.5, -2.2, -0.8]), rtol=1e-5)
    assert float(info["clip_fraction"]) == pytest.approx(0.75)  # 1.5, 0.5 and 0.7 are outside [0.8, 1.2]
    w = np.array([2.0, 0.0, 1.0, 1.0], np.float32)
    weighted, _ = ppo_math.ppo_clip_loss(log_prob, np.zeros(4, np.float32), adv, 0.2, w)
    np.testing.assert_allclose(float(weighted), -np.mean([2.4, 0.0, -2.2, -0.8]), rtol=1e-5)


def test_proximal_weights_are_truncated_ratios_and_one_on_policy():
    prox = np.log(np.array([0.2, 0.5, 3.0], np.float32))
    beh = np.log(np.array([0.4, 0.5, 0.5], np.float32))
    np.testing.assert_allclose(ppo_math.proximal_weights(prox, beh, 2.0).numpy(), [0.5, 1.0, 2.0], rtol=1e-5)
    np.testing.assert_allclose(ppo_math.proximal_weights(beh, beh, 2.0).numpy(), 1.0)


def test_kl_penalty_loss_with_unit_weights_is_unweighted():
    mu_beh, ls_beh, mu_new, ls_new, acts, adv = _policy_setup(seed=11)
    logp = ppo_math.gaussian_log_prob(mu_new, ls_new, acts)
    logp_beh = ppo_math.gaussian_log_prob(mu_beh, ls_beh, acts)
    kl = ppo_math.gaussian_kl(mu_beh, ls_beh, mu_new, ls_new)
    a, _ = ppo_math.ppo_kl_penalty_loss(logp, logp_beh, adv, kl, 1.0, 0.01)
    b, _ = ppo_math.ppo_kl_penalty_loss(logp, logp_beh, adv, kl, 1.0, 0.01, weights=tf.ones_like(logp))
    np.testing.assert_allclose(float(a), float(b), rtol=1e-6)


def test_clipped_value_loss_keeps_the_larger_of_the_two_losses():
    values = np.array([1.0, 0.0, 3.0], np.float32)
    old = np.array([0.0, 0.0, 2.0], np.float32)
    returns = np.array([2.0, 1.0, 0.0], np.float32)
    clipped = old + np.clip(values - old, -0.2, 0.2)
    expected = 0.5 * np.mean(np.maximum((values - returns) ** 2, (clipped - returns) ** 2))
    assert float(ppo_math.clipped_value_loss(values, old, returns, 0.2)) == pytest.approx(expected)
    # Within the clip range it is the plain value loss.
    assert float(ppo_math.clipped_value_loss(old + 0.1, old, returns, 0.2)) == pytest.approx(
        float(ppo_math.value_loss(old + 0.1, returns))
    )
    with tf.GradientTape() as tape:  # the gradient flows to V only, not to V_old or the targets
        v = tf.Variable(values)
        loss = ppo_math.clipped_value_loss(v, old, returns, 0.2)
    assert tape.gradient(loss, v) is not None


def test_approx_kl_and_explained_variance():
    rng = np.random.default_rng(0)
    old = rng.standard_normal(1000).astype(np.float32)
    assert float(ppo_math.approx_kl(old, old)) == 0.0
    new = old + 0.1 * rng.standard_normal(1000).astype(np.float32)
    r = new - old
    assert float(ppo_math.approx_kl(new, old)) == pytest.approx(np.mean(np.exp(r) - 1 - r), rel=1e-4)
    targets = rng.standard_normal(500).astype(np.float32)
    assert float(ppo_math.explained_variance(targets, targets)) == pytest.approx(1.0)
    assert float(ppo_math.explained_variance(np.zeros_like(targets) + targets.mean(), targets)) == pytest.approx(
        0.0, abs=1e-5
    )
    assert float(ppo_math.explained_variance(-targets, targets)) < 0
    assert np.isnan(float(ppo_math.explained_variance(targets, np.ones_like(targets))))
