import math

import numpy as np
import pytest
import tensorflow as tf

from rlfleet.algorithms.dqn import losses as dqn_math


def np_softmax(x):
    z = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return z / np.sum(z, axis=-1, keepdims=True)


def np_kl(q_student, q_teacher, tau):
    p = np_softmax(np.asarray(q_teacher, np.float64) / tau)
    q = np_softmax(np.asarray(q_student, np.float64) / tau)
    return np.sum(p * (np.log(p) - np.log(q)), axis=-1)


# ---------------------------------------------------------------- n-step targets


def test_n_step_no_done_bootstraps_with_gamma_n():
    ret, disc = dqn_math.n_step_targets([[1.0, 2.0, 3.0]], [[0.0, 0.0, 0.0]], [10.0], 0.9)
    # 1 + 0.9 * 2 + 0.81 * 3 + 0.729 * 10
    np.testing.assert_allclose(ret.numpy(), [12.52], rtol=1e-6)
    np.testing.assert_allclose(disc.numpy(), [0.729], rtol=1e-6)


def test_n_step_done_in_middle_cuts_later_rewards_and_bootstrap():
    ret, disc = dqn_math.n_step_targets([[1.0, 2.0, 3.0]], [[0.0, 1.0, 0.0]], [10.0], 0.9)
    np.testing.assert_allclose(ret.numpy(), [1.0 + 0.9 * 2.0], rtol=1e-6)
    np.testing.assert_allclose(disc.numpy(), [0.0])


def test_n_step_done_at_last_step_keeps_all_rewards_no_bootstrap():
    ret, disc = dqn_math.n_step_targets([[1.0, 2.0, 3.0]], [[0.0, 0.0, 1.0]], [10.0], 0.9)
    np.testing.assert_allclose(ret.numpy(), [1.0 + 1.8 + 2.43], rtol=1e-6)
    np.testing.assert_allclose(disc.numpy(), [0.0])


def test_n_step_batch_with_bool_dones_and_first_step_done():
    rewards = [[1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [-1.0, 0.5, 4.0]]
    dones = [[True, False, False], [False, True, True], [False, False, False]]
    ret, disc = dqn_math.n_step_targets(rewards, dones, [10.0, 10.0, -2.0], 0.5)
    np.testing.assert_allclose(ret.numpy(), [1.0, 2.0, -1.0 + 0.25 + 1.0 + 0.125 * -2.0], rtol=1e-6)
    np.testing.assert_allclose(disc.numpy(), [0.0, 0.0, 0.125])


def test_n_step_one_step_and_inside_tf_function():
    fn = tf.function(dqn_math.n_step_targets)
    ret, disc = fn(tf.constant([[2.0], [3.0]]), tf.constant([[0.0], [1.0]]), tf.constant([5.0, 5.0]), tf.constant(0.99))
    np.testing.assert_allclose(ret.numpy(), [2.0 + 0.99 * 5.0, 3.0], rtol=1e-6)
    np.testing.assert_allclose(disc.numpy(), [0.99, 0.0], rtol=1e-6)
    assert ret.dtype == tf.float32 and disc.dtype == tf.float32


def test_n_step_rejects_mismatched_shapes():
    with pytest.raises(ValueError):
        dqn_math.n_step_targets([[1.0, 2.0]], [[0.0, 0.0, 0.0]], [1.0], 0.9)
    with pytest.raises(ValueError):
        dqn_math.n_step_targets([1.0, 2.0], [0.0, 0.0], [1.0], 0.9)


# ---------------------------------------------------------------- Huber


def test_huber_quadratic_and_linear_regions():
    # |0.5| < 1: 0.5 * 0.25 = 0.125 ; |3| > 1: 3 - 0.5 = 2.5
    assert dqn_math.huber_td_loss([0.5], [0.0]).numpy() == pytest.approx(0.125)
    assert dqn_math.huber_td_loss([-2.0], [1.0]).numpy() == pytest.approx(2.5)
    got = dqn_math.huber_td_loss([0.5, 3.0], [0.0, 0.0]).numpy()
    assert got == pytest.approx((0.125 + 2.5) / 2)
    # delta 2, |err| 3: 2 * (3 - 1) = 4
    assert dqn_math.huber_td_loss([3.0], [0.0], delta=2.0).numpy() == pytest.approx(4.0)


def test_huber_gradients_stop_at_targets():
    q = tf.Variable([3.0, 0.5])
    t = tf.Variable([0.0, 0.0])
    with tf.GradientTape() as tape:
        loss = dqn_math.huber_td_loss(q, t)
    gq, gt = tape.gradient(loss, [q, t])
    assert gt is None
    # d/dq mean: linear region slope 1, quadratic region slope err; / N
    np.testing.assert_allclose(gq.numpy(), [0.5, 0.25], rtol=1e-6)


def test_huber_rejects_bad_delta():
    with pytest.raises(ValueError):
        dqn_math.huber_td_loss([1.0], [0.0], delta=0.0)


# ---------------------------------------------------------------- distillation


def test_distillation_matches_hand_kl():
    # teacher softmax([1, 0]) = [e, 1] / (e + 1); student uniform.
    got = dqn_math.distillation_loss([[0.0, 0.0]], [[1.0, 0.0]], temperature=1.0).numpy()
    p = math.e / (math.e + 1.0)
    hand = p * math.log(p / 0.5) + (1 - p) * math.log((1 - p) / 0.5)
    np.testing.assert_allclose(got, [hand], rtol=1e-5)


def test_distillation_matches_numpy_batch():
    rng = np.random.default_rng(0)
    qs = rng.normal(size=(4, 5)).astype(np.float32)
    qt = rng.normal(size=(4, 5)).astype(np.float32)
    got = dqn_math.distillation_loss(qs, qt, temperature=0.5).numpy()
    assert got.shape == (4,)
    np.testing.assert_allclose(got, np_kl(qs, qt, 0.5), rtol=1e-4, atol=1e-6)
    assert np.all(got > 0)


def test_distillation_zero_when_equal_and_shift_invariant():
    q = np.array([[1.0, 2.0, -3.0], [0.0, 0.0, 0.0]], np.float32)
    np.testing.assert_allclose(dqn_math.distillation_loss(q, q).numpy(), [0.0, 0.0], atol=1e-6)
    # softmax ignores a per-row constant shift
    np.testing.assert_allclose(dqn_math.distillation_loss(q + 7.0, q).numpy(), [0.0, 0.0], atol=1e-5)


def test_distillation_temperature_sharpens_and_is_stable():
    qs, qt = [[0.0, 0.1]], [[0.1, 0.0]]
    cold = dqn_math.distillation_loss(qs, qt, temperature=0.1).numpy()[0]
    warm = dqn_math.distillation_loss(qs, qt, temperature=1.0).numpy()[0]
    assert cold > warm > 0
    np.testing.assert_allclose(cold, np_kl(qs, qt, 0.1)[0], rtol=1e-4)
    # large Q-values at tau = 0.1 (logits ~1e4) stay finite
    big = dqn_math.distillation_loss([[1000.0, 0.0]], [[0.0, 1000.0]]).numpy()
    assert np.all(np.isfinite(big))
    np.testing.assert_allclose(big, [10000.0], rtol=1e-4)


def test_distillation_gradient_flows_to_student_only():
    qs = tf.Variable([[0.0, 1.0, 2.0]])
    qt = tf.Variable([[2.0, 1.0, 0.0]])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(dqn_math.distillation_loss(qs, qt, 1.0))
    gs, gt = tape.gradient(loss, [qs, qt])
    assert gt is None
    # d KL / d z_student = (p_S - p_T) / tau
    expected = np_softmax(np.array([[0.0, 1.0, 2.0]])) - np_softmax(np.array([[2.0, 1.0, 0.0]]))
    np.testing.assert_allclose(gs.numpy(), expected, rtol=1e-5, atol=1e-6)


def test_distillation_rejects_bad_temperature():
    with pytest.raises(ValueError):
        dqn_math.distillation_loss([[0.0]], [[0.0]], temperature=0.0)


# ---------------------------------------------------------------- qdagger loss


def test_qdagger_loss_composition():
    qs = np.array([[1.0, 2.0], [0.0, -1.0]], np.float32)
    qt = np.array([[2.0, 0.0], [0.0, 1.0]], np.float32)
    actions = np.array([1, 0], np.int32)
    targets = np.array([2.5, 3.0], np.float32)
    loss, info = dqn_math.qdagger_loss(qs, actions, targets, qt, 3.0, 0.1)
    td = (0.5 * 0.25 + (3.0 - 0.5)) / 2  # errs -0.5 and -3
    distill = np.mean(np_kl(qs, qt, 0.1))
    np.testing.assert_allclose(info["td_loss"].numpy(), td, rtol=1e-6)
    np.testing.assert_allclose(info["distillation_loss"].numpy(), distill, rtol=1e-4)
    np.testing.assert_allclose(loss.numpy(), td + 3.0 * distill, rtol=1e-4)
    loss0, info0 = dqn_math.qdagger_loss(qs, actions, targets, qt, 0.0)
    np.testing.assert_allclose(loss0.numpy(), td, rtol=1e-6)
    assert info0["distillation_loss"].numpy() > 0


def test_qdagger_loss_in_tf_function_gradients():
    qs = tf.Variable([[1.0, 2.0], [0.0, -1.0]])
    qt = tf.Variable([[2.0, 0.0], [0.0, 1.0]])

    @tf.function
    def grads():
        with tf.GradientTape() as tape:
            loss, _ = dqn_math.qdagger_loss(qs, tf.constant([1, 0]), tf.constant([2.5, 3.0]), qt, tf.constant(0.0))
        return tape.gradient(loss, qs)

    g = grads().numpy()
    # coef 0: only the selected actions get gradient, from the Huber loss
    np.testing.assert_allclose(g, [[0.0, -0.25], [-0.5, 0.0]], rtol=1e-6)


# ---------------------------------------------------------------- schedules


def test_distillation_coefficient_schedule():
    f = dqn_math.distillation_coefficient
    kw = dict(teacher_return=100.0, random_return=0.0, step=10, cutoff_step=1000)
    assert f(3.0, 0.0, **kw) == pytest.approx(3.0)  # at random
    assert f(3.0, -50.0, **kw) == pytest.approx(3.0)  # below random: <= base
    assert f(3.0, 50.0, **kw) == pytest.approx(1.5)  # halfway
    assert f(3.0, 100.0, **kw) == 0.0  # at teacher
    assert f(3.0, 150.0, **kw) == 0.0  # beyond teacher
    assert f(3.0, 0.0, 100.0, 0.0, step=1000, cutoff_step=1000) == 0.0
    assert f(3.0, 0.0, 100.0, 0.0, step=5000, cutoff_step=1000) == 0.0
    # non-zero random baseline: (5 - (-10)) / (20 - (-10)) = 0.5
    assert f(2.0, 5.0, 20.0, -10.0, 0, 10) == pytest.approx(1.0)
    assert f(3.0, 0.0, 100.0, 0.0, 10, None) == pytest.approx(3.0)


def test_distillation_coefficient_rejects_bad_teacher():
    with pytest.raises(ValueError, match="teacher_return"):
        dqn_math.distillation_coefficient(3.0, 1.0, 5.0, 5.0, 0, 10)
    with pytest.raises(ValueError, match="teacher_return"):
        dqn_math.distillation_coefficient(3.0, 1.0, 2.0, 5.0, 0, 10)


def test_interpolated_learning_rate():
    f = dqn_math.interpolated_learning_rate
    assert f(3.0, 3.0) == pytest.approx(1e-4)
    assert f(0.0, 3.0) == pytest.approx(1e-5)
    assert f(1.5, 3.0) == pytest.approx(5.5e-5)
    assert f(1.0, 2.0, lr_distill=3e-4, lr_final=1e-4) == pytest.approx(2e-4)
    assert f(0.0, 0.0) == pytest.approx(1e-5)


def test_linear_epsilon():
    f = dqn_math.linear_epsilon
    assert f(0, 1.0, 0.01, 100) == pytest.approx(1.0)
    assert f(50, 1.0, 0.01, 100) == pytest.approx(0.505)
    assert f(100, 1.0, 0.01, 100) == pytest.approx(0.01)
    assert f(10_000, 1.0, 0.01, 100) == pytest.approx(0.01)
    assert f(5, 1.0, 0.1, 0) == pytest.approx(0.1)
    with pytest.raises(ValueError):
        f(0, 1.0, 0.1, -1)


def test_bootstrap_value_dqn_and_double_dqn():
    q_target = np.array([[1.0, 5.0, 2.0], [0.0, -1.0, 3.0]], np.float32)
    q_online = np.array([[9.0, 0.0, 0.0], [0.0, 4.0, 1.0]], np.float32)
    np.testing.assert_allclose(dqn_math.bootstrap_value(q_target).numpy(), [5.0, 3.0])
    # double DQN: the online network's argmax (0, 1) scored by the target network
    np.testing.assert_allclose(dqn_math.bootstrap_value(q_target, q_online).numpy(), [1.0, -1.0])


def test_importance_weights_and_item_priorities_by_hand():
    """Schaul et al. 2016: w_i = (N·P(i))^-β / max w; an item's priority is its largest valid |δ| + ε."""
    w = dqn_math.importance_weights([0.5, 0.25, 0.25], [4, 4, 4], 0.5).numpy()
    # (4·0.5)^-0.5 = 0.7071, (4·0.25)^-0.5 = 1 -> divided by the largest, 1
    np.testing.assert_allclose(w, [0.70710678, 1.0, 1.0], rtol=1e-6)
    np.testing.assert_allclose(dqn_math.importance_weights([0.5, 0.25], [4, 4], 0.0).numpy(), [1.0, 1.0])
    td = [0.5, -2.0, 3.0, -0.25, 9.0]
    item = [0, 0, 1, 1, 1]
    valid = [1.0, 1.0, 1.0, 1.0, 0.0]  # the 9.0 has no bootstrap observation: it does not count
    got = dqn_math.item_priorities(td, tf.constant(item), 2, valid).numpy()
    np.testing.assert_allclose(got, [2.0 + dqn_math.PRIORITY_FLOOR, 3.0 + dqn_math.PRIORITY_FLOOR], rtol=1e-6)


def test_large_margin_and_cql_terms_by_hand():
    """DQfD's large margin (Hester et al. 2018, Eq. 2) and the CQL(H) term (Kumar et al. 2020), on small cases."""
    q = [[1.0, 0.5, 0.2], [2.0, 3.0, 0.0]]
    # state 0: teacher action 0; max(1 + 0, 0.5 + 1, 0.2 + 1) - 1 = 0.5. state 1: teacher action 1;
    # max(2 + 1, 3 + 0, 0 + 1) - 3 = 0 (it leads by the margin already).
    got = dqn_math.large_margin_loss(tf.constant(q), tf.constant([0, 1]), 1.0).numpy()
    np.testing.assert_allclose(got, [0.5, 0.0], atol=1e-6)
    # CQL at τ = 1: logsumexp(q) - q[a]; state 0, a = 2: log(e^1 + e^0.5 + e^0.2) - 0.2
    want0 = math.log(math.exp(1.0) + math.exp(0.5) + math.exp(0.2)) - 0.2
    want1 = math.log(math.exp(2.0 / 0.5) + math.exp(3.0 / 0.5) + 1.0) - 3.0 / 0.5  # τ = 0.5, a = 1
    np.testing.assert_allclose(dqn_math.cql_loss(tf.constant(q[:1]), [2], 1.0).numpy(), [want0], rtol=1e-6)
    np.testing.assert_allclose(dqn_math.cql_loss(tf.constant(q[1:]), [1], 0.5).numpy(), [want1], rtol=1e-6)
