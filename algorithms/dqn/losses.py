"""Pure TensorFlow 2 math for the DQN and QDagger learners.

Tensor functions work on float32 tensors, eagerly and inside ``tf.function``;
the schedules (``distillation_coefficient``, ``interpolated_learning_rate``,
``linear_epsilon``) are pure python and return python floats.

Algorithm details follow "Reincarnating Reinforcement Learning: Reusing Prior
Computation to Accelerate Progress" (Agarwal, Schwarzer, Castro, Courville &
Bellemare, NeurIPS 2022) and its reincarnating_rl / Dopamine configs: a DQN
student trained with a Huber TD loss on 3-step returns (gamma 0.99), plus the
QDagger distillation term
lambda * KL(softmax(Q_teacher / tau) || softmax(Q_student / tau)), tau = 0.1
(presets may differ: 1.0 for CartPole/Acrobot, see rlfleet.algorithms.qdagger.config),
base lambda 3.0, decayed after each evaluation as the student's return
approaches the teacher's and forced to 0 after a step cutoff; the learning
rate interpolates from 1e-4 (distilling) to 1e-5 (lambda = 0).
"""

import math

import tensorflow as tf


def _f32(x):
    return tf.cast(tf.convert_to_tensor(x), tf.float32)


def n_step_targets(rewards, dones, bootstrap_q, discount):
    """n-step discounted return, cut at the first episode end, bootstrapped.

    alive_k          = prod_{j<k} (1 - d_j)          (1 for k = 0)
    returns          = sum_{k<n} discount^k * alive_k * r_k
                       + bootstrap_discount * bootstrap_q
    bootstrap_discount = discount^n * prod_{j<n} (1 - d_j)

    So the reward of the step on which the episode ends is kept, rewards after
    it are dropped, and nothing is bootstrapped when any of the n steps ended
    the episode (bootstrap_discount = 0); otherwise bootstrap_discount =
    discount^n.

    Args:
      rewards: float32 [N, n], r_k of the n steps following each sampled item.
      dones: float or bool [N, n]; 1 where the episode ended after step k.
      bootstrap_q: float32 [N], max_a Q_target(s_{t+n}, a) (or the double-DQN
        value Q_target(s_{t+n}, argmax_a Q_online(s_{t+n}, a))).
      discount: python float or scalar tensor, gamma.
    Returns:
      (returns float32 [N], bootstrap_discount float32 [N]).
    Raises:
      ValueError if rewards is not rank 2 or the static shapes of dones /
      bootstrap_q do not match it; tf.errors.InvalidArgumentError on dynamic
      mismatches.
    Source: n-step Q-learning target of the DQN student in Agarwal et al. 2022
    (reincarnating_rl / Dopamine configs use update_horizon 3, gamma 0.99).
    """
    rewards = _f32(rewards)
    not_done = 1.0 - _f32(dones)
    bootstrap_q = _f32(bootstrap_q)
    discount = _f32(discount)
    rewards.shape.assert_has_rank(2)
    not_done.shape.assert_is_compatible_with(rewards.shape)
    bootstrap_q.shape.assert_is_compatible_with(rewards.shape[:1])
    n = tf.shape(rewards)[1]
    powers = tf.pow(discount, tf.cast(tf.range(n), tf.float32))  # [n]
    alive = tf.math.cumprod(not_done, axis=1, exclusive=True)  # [N, n]
    partial = tf.reduce_sum(powers * alive * rewards, axis=1)
    bootstrap_discount = tf.pow(discount, tf.cast(n, tf.float32)) * tf.reduce_prod(not_done, axis=1)
    return partial + bootstrap_discount * bootstrap_q, bootstrap_discount


def bootstrap_value(q_target_next, q_online_next=None):
    """The value of the bootstrap state s_{t+n}: float32 [N].

    DQN: max_a Q_target(s, a). Double DQN (van Hasselt, Guez & Silver 2016,
    "Deep Reinforcement Learning with Double Q-learning", Eq. 4), when
    `q_online_next` is given: Q_target(s, argmax_a Q_online(s, a)); the online
    network picks the action and the target network scores it, which removes
    most of max's overestimation.

    Args:
      q_target_next: float32 [N, A], target-network Q-values at s_{t+n}.
      q_online_next: optional float32 [N, A], online-network Q-values at s_{t+n}.
    """
    q_target_next = _f32(q_target_next)
    if q_online_next is None:
        return tf.reduce_max(q_target_next, axis=-1)
    best = tf.argmax(_f32(q_online_next), axis=-1, output_type=tf.int32)
    return tf.gather(q_target_next, best, batch_dims=1)


def huber_td_loss(q_selected, targets, delta=1.0, weights=None):
    """Mean Huber loss between Q(s, a) and TD targets (weighted mean with `weights`).

    err = q_selected - targets
    per-sample = 0.5 * err^2               if |err| <= delta
                 delta * (|err| - delta/2) otherwise

    Args:
      q_selected: float32 [N], Q_online(s, a) for the taken actions.
      targets: float32 [N] (treated as constants: gradients are stopped).
      delta: positive python float, the quadratic-to-linear switch point.
      weights: optional float32 [N] >= 0 (0 leaves a sample out, e.g. a transition without a bootstrap
        observation); the loss is then sum(w * per-sample) / max(sum(w), 1).
    Returns:
      float32 scalar, the (weighted) mean over N.
    Raises:
      ValueError if delta <= 0 (python number) or shapes are incompatible.
    Source: DQN Huber loss (delta 1) used by the QDagger student in the
    reincarnating_rl / Dopamine configs (Agarwal et al. 2022).
    """
    if isinstance(delta, (int, float)) and delta <= 0:
        raise ValueError(f"huber delta must be > 0, got {delta}")
    q_selected = _f32(q_selected)
    targets = tf.stop_gradient(_f32(targets))
    q_selected.shape.assert_is_compatible_with(targets.shape)
    delta = _f32(delta)
    abs_err = tf.abs(q_selected - targets)
    quadratic = tf.minimum(abs_err, delta)
    linear = abs_err - quadratic
    return weighted_mean(0.5 * tf.square(quadratic) + delta * linear, weights)


def importance_weights(probability, table_size, exponent):
    """Importance-sampling weights of prioritized replay, w_i = (size · P(i))^−β / max_j w_j, so that the
    largest is 1 (Schaul et al. 2016, "Prioritized Experience Replay", Sec. 3.4).

    Args:
      probability: float [K], the probability each item was sampled with.
      table_size: int or float [K], the items in the table when it was sampled.
      exponent: β in [0, 1] (0: every weight 1; 1: fully compensates the non-uniform sampling).
    Returns:
      float32 [K].
    """
    w = tf.pow(_f32(table_size) * _f32(probability), -_f32(exponent))
    return w / tf.reduce_max(w)


def item_priorities(td_errors, item, items, valid):
    """New priorities of the sampled items, each the largest |TD error| of its valid transitions (a small floor
    keeps every item samplable): Schaul et al. 2016's proportional variant, p = |δ| + ε, with an item of several
    envs' transitions given its largest.

    Args:
      td_errors: float32 [N]; item: int32 [N], each transition's item (0..items-1); items: K;
      valid: float32 [N], 0 for a transition not trained on (its error does not count).
    Returns:
      float32 [K] (Reverb raises them to the table's priority exponent α when it samples).
    """
    magnitude = tf.abs(_f32(td_errors)) * _f32(valid)
    return tf.math.unsorted_segment_max(magnitude, item, items) + PRIORITY_FLOOR


PRIORITY_FLOOR = 1e-6  # ε of the proportional priorities: an item whose error is 0 stays samplable


def weighted_mean(values, weights=None):
    """sum(weights * values) / max(sum(weights), 1) for float32 [N] `values` (the plain mean without weights)."""
    values = _f32(values)
    if weights is None:
        return tf.reduce_mean(values)
    weights = _f32(weights)
    return tf.reduce_sum(weights * values) / tf.maximum(tf.reduce_sum(weights), 1.0)


def distillation_loss(q_student, q_teacher, temperature=0.1):
    """Per-sample KL(softmax(q_teacher / tau) || softmax(q_student / tau)).

    KL = sum_a p_T(a) * (log p_T(a) - log p_S(a)), with both log-probabilities
    from ``log_softmax`` (stable for large Q / small tau). It differs from the
    cross-entropy -sum_a p_T log p_S only by the teacher entropy, a constant
    for the student, so gradients are identical; KL is 0 when the student's
    and teacher's softmax policies agree.

    Args:
      q_student: float32 [N, A], student Q-values (differentiable).
      q_teacher: float32 [N, A], teacher Q-values (gradients are stopped).
      temperature: positive python float or scalar tensor, tau.
    Returns:
      float32 [N], >= 0 (up to rounding).
    Raises:
      ValueError if temperature <= 0 (python number) or the static shapes
      differ.
    Source: QDagger distillation term, tau = 0.1 (Agarwal et al. 2022,
    reincarnating_rl configs).
    """
    if isinstance(temperature, (int, float)) and temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    q_student = _f32(q_student)
    q_teacher = tf.stop_gradient(_f32(q_teacher))
    q_student.shape.assert_is_compatible_with(q_teacher.shape)
    temperature = _f32(temperature)
    log_p_teacher = tf.nn.log_softmax(q_teacher / temperature, axis=-1)
    log_p_student = tf.nn.log_softmax(q_student / temperature, axis=-1)
    return tf.reduce_sum(tf.exp(log_p_teacher) * (log_p_teacher - log_p_student), axis=-1)


def qdagger_loss(q_student_all, actions, targets, q_teacher_all, distill_coef, temperature=0.1):
    """QDagger objective: Huber TD loss + distill_coef * mean distillation KL.

    loss = huber_td_loss(Q_student(s, a), targets)
           + distill_coef * mean_N distillation_loss(Q_student(s, .),
                                                     Q_teacher(s, .), tau)

    Args:
      q_student_all: float32 [N, A], student Q-values for all actions.
      actions: int32 (or int64) [N], actions taken, in [0, A).
      targets: float32 [N], TD targets, e.g. from ``n_step_targets``
        (gradients stopped).
      q_teacher_all: float32 [N, A], teacher Q-values (gradients stopped).
      distill_coef: python float or scalar tensor, lambda (0 = plain DQN).
      temperature: tau, as in ``distillation_loss``.
    Returns:
      (loss float32 scalar, info dict of float32 scalars 'td_loss',
      'distillation_loss' (the unweighted mean KL)).
    Raises:
      ValueError / tf.errors.InvalidArgumentError on mismatched shapes or
      out-of-range actions (gather), ValueError on temperature <= 0.
    Source: Agarwal et al. 2022 (QDagger = DQN loss + lambda * distillation,
    in both the offline and the online phase).
    """
    q_student_all = _f32(q_student_all)
    q_student_all.shape.assert_has_rank(2)
    actions = tf.cast(tf.convert_to_tensor(actions), tf.int32)
    actions.shape.assert_is_compatible_with(q_student_all.shape[:1])
    q_selected = tf.gather(q_student_all, actions, axis=1, batch_dims=1)
    td = huber_td_loss(q_selected, targets)
    distill = tf.reduce_mean(distillation_loss(q_student_all, q_teacher_all, temperature))
    loss = td + _f32(distill_coef) * distill
    return loss, {"td_loss": td, "distillation_loss": distill}


def large_margin_loss(q_student, teacher_actions, margin=1.0):
    """Per-sample large-margin loss toward the teacher's action: max_a [Q(s, a) + ℓ(a_T, a)] − Q(s, a_T), with
    ℓ(a_T, a) = `margin` for a ≠ a_T and 0 for a_T; 0 once a_T leads every other action by the margin.

    Args:
      q_student: float32 [N, A], student Q-values (differentiable).
      teacher_actions: int32 [N], the teacher's action a_T (its greedy action).
      margin: python float or scalar tensor > 0 (reward units).
    Returns:
      float32 [N], >= 0.
    Source: DQfD (Hester et al. 2018, "Deep Q-learning from Demonstrations", Eq. 2), the supervised term of the
    Reincarnating RL paper's DQfD baseline (reincarnating_rl dqfd_dqn: margin 1, coefficient 1, teacher actions).
    """
    q_student = _f32(q_student)
    teacher_actions = tf.cast(teacher_actions, tf.int32)
    others = 1.0 - tf.one_hot(teacher_actions, tf.shape(q_student)[-1], dtype=tf.float32)
    chosen = tf.gather(q_student, teacher_actions, axis=1, batch_dims=1)
    return tf.reduce_max(q_student + _f32(margin) * others, axis=-1) - chosen


def cql_loss(q_student, actions, temperature=1.0):
    """Per-sample CQL(H) regulariser: logsumexp_a Q(s, a)/τ − Q(s, a_data)/τ (pushes down actions the data did
    not take).

    Args:
      q_student: float32 [N, A] (differentiable); actions: int32 [N], the data's actions;
      temperature: τ > 0.
    Returns:
      float32 [N], >= 0.
    Source: Kumar et al. 2020, "Conservative Q-Learning for Offline RL", Eq. 4; the offline phase of the
    Reincarnating RL paper's pretraining baseline (reincarnating_rl pretrained_dqn: coefficient 1).
    """
    q = _f32(q_student) / _f32(temperature)
    chosen = tf.gather(q, tf.cast(actions, tf.int32), axis=1, batch_dims=1)
    return tf.reduce_logsumexp(q, axis=-1) - chosen


def distillation_coefficient(base, student_return, teacher_return, random_return, step, cutoff_step):
    """QDagger distillation coefficient lambda (pure python).

    lambda = base * max(0, 1 - (R_student - R_random) / (R_teacher - R_random)),
    clipped to <= base (a student below random gets base), and 0 once
    step >= cutoff_step (cutoff_step None: no cutoff).

    Args:
      base: python float >= 0 (3.0 in the reincarnating_rl configs).
      student_return, teacher_return, random_return: mean evaluation returns.
      step, cutoff_step: training steps (same unit).
    Returns:
      python float in [0, base].
    Raises:
      ValueError if teacher_return <= random_return (normalisation undefined),
      if base < 0, or if any return is not finite.
    Source: Agarwal et al. 2022: lambda decays with the student's normalised
    score relative to the teacher after each evaluation and is set to 0 after
    a fixed number of steps (reincarnating_rl configs).
    """
    base = float(base)
    student_return = float(student_return)
    teacher_return = float(teacher_return)
    random_return = float(random_return)
    if base < 0:
        raise ValueError(f"base distillation coefficient must be >= 0, got {base}")
    for name, value in (
        ("student_return", student_return),
        ("teacher_return", teacher_return),
        ("random_return", random_return),
    ):
        if not math.isfinite(value):
            raise ValueError(f"{name} must be finite, got {value}")
    if teacher_return <= random_return:
        raise ValueError(
            f"teacher_return ({teacher_return}) must exceed random_return "
            f"({random_return}) to normalise the student return"
        )
    if cutoff_step is not None and step >= cutoff_step:
        return 0.0
    progress = (student_return - random_return) / (teacher_return - random_return)
    return float(min(base, base * max(0.0, 1.0 - progress)))


def interpolated_learning_rate(distill_coef, base_coef, lr_distill=1e-4, lr_final=1e-5):
    """Learning rate linear in distill_coef / base_coef (pure python).

    lr = lr_final + clip(distill_coef / base_coef, 0, 1) * (lr_distill - lr_final)
    i.e. lr_distill while fully distilling (coef = base) and lr_final once the
    coefficient reaches 0. base_coef == 0 (no distillation) gives lr_final.

    Returns a python float. Raises ValueError if base_coef < 0.
    Source: reincarnating_rl QDagger configs (Agarwal et al. 2022): 1e-4 while
    distilling, 1e-5 after lambda reaches 0.
    """
    distill_coef, base_coef = float(distill_coef), float(base_coef)
    if base_coef < 0:
        raise ValueError(f"base_coef must be >= 0, got {base_coef}")
    if base_coef == 0:
        return float(lr_final)
    frac = min(1.0, max(0.0, distill_coef / base_coef))
    return float(lr_final + frac * (lr_distill - lr_final))


def linear_epsilon(step, start, end, decay_steps):
    """Epsilon-greedy schedule: linear from start to end, then constant.

    eps = start + min(1, max(0, step) / decay_steps) * (end - start)
    (decay_steps == 0 gives end immediately).

    Returns a python float. Raises ValueError if decay_steps < 0.
    Source: DQN / Dopamine linearly decaying epsilon used by the QDagger
    student's actors (Agarwal et al. 2022 configs).
    """
    if decay_steps < 0:
        raise ValueError(f"decay_steps must be >= 0, got {decay_steps}")
    if decay_steps == 0:
        return float(end)
    frac = min(1.0, max(0.0, float(step)) / float(decay_steps))
    return float(start + frac * (end - start))
