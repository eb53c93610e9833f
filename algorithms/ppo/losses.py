"""Pure TensorFlow 2 math for the PPO learner.

All functions work on float32 tensors, eagerly and inside ``tf.function``.
Algorithm details follow the BatchPPO paper ("TensorFlow Agents: Efficient
Batched Reinforcement Learning in TensorFlow", Hafner, Davidson & Vanhoucke,
2017) and its reference configs: diagonal Gaussian policy, advantage =
discounted return - V (GAE optional), policy loss
-E[ratio * A] + beta * KL(old || new) + 1000 * max(0, KL - 2 * kl_target)^2,
beta adapted by x1.5 / /1.5 around [0.7, 1.3] * kl_target; and the clipped
objective of PPO (Schulman et al. 2017), the decoupled proximal-policy
weights of Hilton et al. 2021, and time limits that bootstrap instead of
terminating (Pardo et al. 2018).
"""

import math

import tensorflow as tf

_LOG_2PI = math.log(2.0 * math.pi)


def _f32(x):
    return tf.cast(tf.convert_to_tensor(x), tf.float32)


def gaussian_log_prob(mean, log_std, actions):
    """Log density of a diagonal Gaussian, summed over the action axis.

    Args:
      mean: float32 [..., A].
      log_std: float32, broadcastable to [..., A] (e.g. [A] for a
        state-independent std as in BatchPPO).
      actions: float32 [..., A].
    Returns:
      float32 [...]: sum_a -0.5 * ((x - mu) / sigma)^2 - log sigma - 0.5 log 2pi.
    Raises:
      tf.errors.InvalidArgumentError / ValueError if shapes do not broadcast.
    Source: standard diagonal-Gaussian policy used by BatchPPO (Hafner et al. 2017).
    """
    mean, log_std, actions = _f32(mean), _f32(log_std), _f32(actions)
    z = (actions - mean) * tf.exp(-log_std)
    per_dim = -0.5 * tf.square(z) - log_std - 0.5 * _LOG_2PI
    per_dim = per_dim + tf.zeros_like(mean)  # broadcast to [..., A]
    return tf.reduce_sum(per_dim, axis=-1)


def gaussian_kl(mean_p, log_std_p, mean_q, log_std_q):
    """Closed-form KL(p || q) of diagonal Gaussians, summed over the last axis.

    KL = sum_a [log(s_q / s_p) + (s_p^2 + (mu_p - mu_q)^2) / (2 s_q^2) - 1/2].

    Args:
      mean_p, mean_q: float32 [..., A].
      log_std_p, log_std_q: float32, broadcastable to [..., A].
    Returns:
      float32 [...], >= 0; exactly 0 when p == q.
    Raises:
      tf.errors.InvalidArgumentError / ValueError if shapes do not broadcast.
    Source: BatchPPO penalises KL(old || new) between the behaviour (old) and
    current (new) policies (Hafner et al. 2017): pass old as p, new as q.
    """
    mean_p, log_std_p = _f32(mean_p), _f32(log_std_p)
    mean_q, log_std_q = _f32(mean_q), _f32(log_std_q)
    var_ratio = tf.exp(2.0 * (log_std_p - log_std_q))
    mean_term = tf.square(mean_p - mean_q) * tf.exp(-2.0 * log_std_q)
    per_dim = (log_std_q - log_std_p) + 0.5 * (var_ratio + mean_term) - 0.5
    per_dim = per_dim + tf.zeros_like(mean_p) + tf.zeros_like(mean_q)
    return tf.reduce_sum(per_dim, axis=-1)


def gaussian_entropy(log_std):
    """Entropy of a diagonal Gaussian, summed over the last axis.

    Args:
      log_std: float32 [..., A].
    Returns:
      float32 [...]: sum_a log_std + 0.5 * (1 + log 2pi).
    Raises: nothing beyond TensorFlow conversion errors.
    Source: standard Gaussian entropy; BatchPPO logs it as a diagnostic.
    """
    log_std = _f32(log_std)
    return tf.reduce_sum(log_std + 0.5 * (1.0 + _LOG_2PI), axis=-1)


@tf.function(
    input_signature=[
        tf.TensorSpec([None, None], tf.float32),
        tf.TensorSpec([None, None], tf.float32),
        tf.TensorSpec([None], tf.float32),
    ]
)
def _backward_recurrence(a, b, initial):
    """y_t = a_t + b_t * y_{t+1} for t = T-1 down to 0, y_T = `initial`: float32 [T, B] from a, b [T, B].

    One graph for every call (called eagerly, ``tf.scan`` builds its loop anew each time and TensorFlow keeps
    about 30 kB of it per call: the learner's memory grew by that much per PPO update).
    """
    return tf.scan(lambda acc, ab: ab[0] + ab[1] * acc, (a, b), initializer=initial, reverse=True)


def next_state_values(values, bootstrap_value, truncated, truncation_values):
    """V of the state that follows each step, for the TD targets.

    next_t = V(obs_{t+1}) (V(obs_T) = bootstrap_value at the last step),
    except where the episode was truncated after step t (a time limit): there
    obs_{t+1} is the next episode's first observation, and the value to
    bootstrap from is V(final observation of the cut episode).

    Args:
      values: float32 [T, B], V(obs_t).
      bootstrap_value: float32 [B], V(obs_T).
      truncated: bool or float [T, B]; 1 where a time limit ended the episode after step t.
      truncation_values: float32 [T, B], V(final observation) (read only where truncated).
    Returns:
      float32 [T, B].
    Source: time limits are not terminal states (Pardo et al. 2018, "Time
    Limits in Reinforcement Learning"; gymnasium's terminated/truncated split).
    """
    values, bootstrap_value = _f32(values), _f32(bootstrap_value)
    following = tf.concat([values[1:], bootstrap_value[None]], axis=0)
    return tf.where(tf.cast(truncated, tf.bool), _f32(truncation_values), following)


def gae_advantages(rewards, values, next_values, terminated, episode_ends, discount, lambda_):
    """Generalised advantage estimation with terminations and truncations.

    delta_t = r_t + discount * (1 - term_t) * next_t - V_t
    A_t     = delta_t + discount * lambda_ * (1 - end_t) * A_{t+1}
    computed with a backward ``tf.scan``; returns = A + values.

    Only a terminal state stops bootstrapping (term_t); any episode end
    (termination or truncation, end_t) stops the accumulation across the
    boundary into the next episode. With lambda_ = 1 the advantages equal the
    discounted return (reset at episode ends, bootstrapped with V at the
    last step and at truncations) minus V, which is the BatchPPO advantage
    definition (Hafner et al. 2017; GAE is optional there). With lambda_ = 0
    they equal the one-step TD error.

    Args:
      rewards: float32 [T, B] (rank 2: a single env is [T, 1]).
      values: float32 [T, B], V(obs_t).
      next_values: float32 [T, B], V of the state after step t (`next_state_values`).
      terminated: float or bool [T, B]; 1 where a terminal state followed step t.
      episode_ends: float or bool [T, B]; 1 where the episode ended after step t
        (terminated or truncated).
      discount, lambda_: python floats or scalar tensors.
    Returns:
      (advantages, returns), both float32 [T, B].
    Raises:
      ValueError / tf.errors.InvalidArgumentError on inconsistent shapes.
    """
    rewards, values, next_values = _f32(rewards), _f32(values), _f32(next_values)
    not_terminal = 1.0 - _f32(terminated)
    not_end = 1.0 - _f32(episode_ends)
    discount, lambda_ = _f32(discount), _f32(lambda_)
    deltas = rewards + discount * not_terminal * next_values - values
    advantages = _backward_recurrence(deltas, discount * lambda_ * not_end, tf.zeros_like(values[0]))
    return advantages, advantages + values


def truncated_ratios(log_ratios, max_ratio=1.0):
    """min(max_ratio, pi(a_t|s_t) / mu(a_t|s_t)) of the log-ratios `log_ratios` (float32 [T, B], log pi - log mu):
    the truncated importance ratios c_t = rho_t that `traced_gae_advantages` weights by (c-bar = rho-bar =
    `max_ratio` > 0; 1 in Retrace and V-trace). Returns float32 [T, B]."""
    return tf.minimum(tf.exp(_f32(log_ratios)), _f32(max_ratio))


def traced_gae_advantages(rewards, values, next_values, terminated, episode_ends, discount, lambda_, ratios):
    """GAE for data an older behaviour policy collected, its later steps weighted toward the target policy.

    rho_t = min(c-bar, pi(a_t|s_t) / mu(a_t|s_t))   (target pi, behaviour mu: `truncated_ratios`)
    delta_t = r_t + discount * (1 - term_t) * next_t - V_t
    A_t     = delta_t + discount * lambda_ * (1 - end_t) * rho_{t+1} * A_{t+1}   (rho_T = 1: V(obs_T) closes it)
    targets = V_t + rho_t * A_t

    The TD error of every step after t is weighted by the truncated ratios of the actions taken since t (the
    traces c of Retrace, Munos et al. 2016, and of V-trace, Espeholt et al. 2018, section 4.1, with c-bar = 1 in
    both papers), so that A_t estimates the advantage of a_t under pi's later actions, not
    mu's; step t's own action is left to the policy loss's importance weight. The value targets weight A_t by
    rho_t (V-trace's first-step correction). With pi = mu (on-policy data) both equal `gae_advantages`.

    Args:
      rewards, values, next_values, terminated, episode_ends, discount, lambda_: as `gae_advantages`.
      ratios: float32 [T, B], rho_t: the truncated ratios pi(a_t|s_t) / mu(a_t|s_t) (`truncated_ratios`).
    Returns:
      (advantages, value targets), both float32 [T, B].
    """
    rewards, values, next_values = _f32(rewards), _f32(values), _f32(next_values)
    not_terminal = 1.0 - _f32(terminated)
    not_end = 1.0 - _f32(episode_ends)
    discount, lambda_ = _f32(discount), _f32(lambda_)
    ratios = _f32(ratios)
    next_ratios = tf.concat([ratios[1:], tf.ones_like(ratios[:1])], axis=0)
    deltas = rewards + discount * not_terminal * next_values - values
    advantages = _backward_recurrence(deltas, discount * lambda_ * not_end * next_ratios, tf.zeros_like(values[0]))
    return advantages, values + ratios * advantages


def discounted_returns(rewards, next_values, terminated, episode_ends, discount):
    """Discounted return, reset at episode ends, bootstrapped at the end and at truncations.

    R_t = r_t + discount * (1 - term_t) * (end_t ? next_t : R_{t+1}),  R_T = next_{T-1}.

    Args:
      rewards: float32 [T, B] (rank 2: a single env is [T, 1]).
      next_values: float32 [T, B] (`next_state_values`; zeros for no bootstrapping).
      terminated: float or bool [T, B]; 1 where a terminal state followed step t.
      episode_ends: float or bool [T, B]; 1 where the episode ended after step t.
      discount: python float or scalar tensor.
    Returns:
      float32 [T, B].
    Raises:
      ValueError / tf.errors.InvalidArgumentError on inconsistent shapes.
    Source: BatchPPO advantage = this return - V (Hafner et al. 2017).
    """
    rewards, next_values = _f32(rewards), _f32(next_values)
    not_terminal, end = 1.0 - _f32(terminated), _f32(episode_ends)
    discount = _f32(discount)
    # R_t = [r_t + γ·nt_t·e_t·next_t] + [γ·nt_t·(1 − e_t)]·R_{t+1}
    return _backward_recurrence(
        rewards + discount * not_terminal * end * next_values, discount * not_terminal * (1.0 - end), next_values[-1]
    )


def normalize_advantages(adv, eps=1e-8):
    """(adv - mean) / (std + eps) over all elements (any shape, float32).

    Returns a float32 tensor of the same shape. BatchPPO normalises the
    advantages over the whole update batch (Hafner et al. 2017 configs).
    """
    adv = _f32(adv)
    mean, var = tf.nn.moments(tf.reshape(adv, [-1]), axes=[0])
    return (adv - mean) / (tf.sqrt(var) + eps)


def ppo_kl_penalty_loss(
    log_prob, behaviour_log_prob, advantages, kl, beta, kl_target, cutoff=(2.0, 1000.0), weights=None
):
    """BatchPPO policy objective with adaptive KL penalty and KL cutoff.

    ratio     = exp(log_prob - behaviour_log_prob)  (importance ratio to the
                behaviour policy that collected the data, or to the proximal
                policy of a decoupled objective: see `proximal_weights`)
    surrogate = -mean(w * ratio * advantages)   (w = 1 unless `weights`)
    penalty   = beta * mean(kl)
    cutoff    = cutoff_coef * max(0, mean(kl) - cutoff_factor * kl_target)^2
    loss      = surrogate + penalty + cutoff

    Args:
      log_prob: float32 [N], log pi_new(a|s) (differentiable).
      behaviour_log_prob: float32 [N], log pi_behaviour(a|s) (treated as a
        constant: gradients are stopped).
      advantages: float32 [N] (constant: gradients are stopped).
      kl: float32 [N], KL(old || new) per sample.
      beta, kl_target: scalars.
      cutoff: (cutoff_factor, cutoff_coef); BatchPPO uses 2 and 1000.
      weights: optional float32 [N] per-sample weights w (constant).
    Returns:
      (loss scalar float32, info dict of float32 scalars 'surrogate',
      'kl_penalty', 'kl_cutoff', 'mean_kl', 'mean_ratio').
    Raises:
      ValueError / tf.errors.InvalidArgumentError on mismatched shapes.
    Source: Hafner et al. 2017 and the BatchPPO reference configs
    (kl_target 0.01, cutoff 1000 * max(0, KL - 2 * target)^2).
    """
    log_prob = _f32(log_prob)
    behaviour_log_prob = tf.stop_gradient(_f32(behaviour_log_prob))
    advantages = tf.stop_gradient(_f32(advantages))
    kl = _f32(kl)
    beta, kl_target = _f32(beta), _f32(kl_target)
    w = tf.ones_like(advantages) if weights is None else tf.stop_gradient(_f32(weights))
    ratio = tf.exp(log_prob - behaviour_log_prob)
    surrogate = -tf.reduce_mean(w * ratio * advantages)
    mean_kl = tf.reduce_mean(kl)
    penalty = beta * mean_kl
    cutoff_factor, cutoff_coef = cutoff
    excess = tf.maximum(0.0, mean_kl - _f32(cutoff_factor) * kl_target)
    cutoff_term = _f32(cutoff_coef) * tf.square(excess)
    loss = surrogate + penalty + cutoff_term
    info = {
        "surrogate": surrogate,
        "kl_penalty": penalty,
        "kl_cutoff": cutoff_term,
        "mean_kl": mean_kl,
        "mean_ratio": tf.reduce_mean(ratio),
    }
    return loss, info


def ppo_clip_loss(log_prob, behaviour_log_prob, advantages, clip_epsilon, weights=None):
    """Clipped surrogate objective (Schulman et al. 2017, "Proximal Policy Optimization Algorithms", Eq. 7).

    ratio = exp(log_prob - behaviour_log_prob)
    loss  = -mean(w * min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A))

    Args:
      log_prob: float32 [N], log pi_new(a|s) (differentiable).
      behaviour_log_prob: float32 [N], log-prob under the policy the ratio is taken to (the
        behaviour policy, or the proximal policy of a decoupled objective, see `proximal_weights`).
      advantages: float32 [N] (constant).
      clip_epsilon: python float or scalar, > 0.
      weights: optional float32 [N] per-sample weights w (constant; 1 when None).
    Returns:
      (loss scalar float32, info dict with 'clip_fraction' and 'mean_ratio').
    """
    log_prob = _f32(log_prob)
    behaviour_log_prob = tf.stop_gradient(_f32(behaviour_log_prob))
    advantages = tf.stop_gradient(_f32(advantages))
    w = tf.ones_like(advantages) if weights is None else tf.stop_gradient(_f32(weights))
    eps = _f32(clip_epsilon)
    ratio = tf.exp(log_prob - behaviour_log_prob)
    clipped = tf.clip_by_value(ratio, 1.0 - eps, 1.0 + eps)
    loss = -tf.reduce_mean(w * tf.minimum(ratio * advantages, clipped * advantages))
    info = {
        "clip_fraction": tf.reduce_mean(tf.cast(tf.abs(ratio - 1.0) > eps, tf.float32)),
        "mean_ratio": tf.reduce_mean(ratio),
    }
    return loss, info


def proximal_weights(proximal_log_prob, behaviour_log_prob, max_weight):
    """Importance weights pi_prox(a|s) / pi_behaviour(a|s), truncated at `max_weight`.

    A decoupled PPO objective (Hilton, Cobbe & Schulman 2021, "Batch
    size-invariance for policy optimization", Sec. 3) takes the ratio and
    the KL term to the *proximal* policy (here the learner's policy when an
    update starts) and corrects for the behaviour policy that collected the
    data (an older version, in an asynchronous actor-learner system) with
    these weights. When the data is on-policy the weights are 1 and the
    objective is the usual one.

    Args:
      proximal_log_prob, behaviour_log_prob: float32 [N].
      max_weight: python float > 0; weights above it are cut to it (bounds the variance).
    Returns:
      float32 [N] in [0, max_weight].
    """
    w = tf.exp(_f32(proximal_log_prob) - _f32(behaviour_log_prob))
    return tf.minimum(w, _f32(max_weight))


def adapt_kl_beta(beta, kl, kl_target, factor=1.5, low=0.7, high=1.3, min_beta=1e-4, max_beta=1e3):
    """Adaptive KL penalty coefficient (pure python floats; numpy ok).

    beta * factor if kl > high * kl_target; beta / factor if
    kl < low * kl_target; else unchanged; then clipped to [min_beta, max_beta].
    Returns a python float. Raises ValueError if kl_target <= 0 or
    min_beta > max_beta.
    Source: BatchPPO (Hafner et al. 2017): x1.5 above 1.3 * target,
    /1.5 below 0.7 * target.
    """
    beta, kl, kl_target = float(beta), float(kl), float(kl_target)
    if kl_target <= 0:
        raise ValueError(f"kl_target must be > 0, got {kl_target}")
    if min_beta > max_beta:
        raise ValueError(f"min_beta {min_beta} > max_beta {max_beta}")
    if kl > high * kl_target:
        beta *= factor
    elif kl < low * kl_target:
        beta /= factor
    return float(min(max(beta, min_beta), max_beta))


def value_loss(values, returns):
    """0.5 * mean((values - returns)^2); inputs float32 of equal shape.

    Returns a float32 scalar; returns are treated as constants (gradients
    stopped). BatchPPO trains a separate value MLP on this regression loss.
    """
    values = _f32(values)
    returns = tf.stop_gradient(_f32(returns))
    return 0.5 * tf.reduce_mean(tf.square(values - returns))


def clipped_value_loss(values, old_values, returns, clip):
    """Clipped value loss: 0.5 * mean(max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2)).

    Args:
      values: float32 [N], V(s) of the network being trained (differentiable).
      old_values: float32 [N], V(s) when the update started (constant).
      returns: float32 [N], value targets (constant).
      clip: python float or scalar, > 0.
    Returns:
      float32 scalar.
    Source: PPO2 of OpenAI Baselines, as CleanRL's `ppo_continuous_action.py` keeps it
    ("The 37 Implementation Details of Proximal Policy Optimization", detail 9).
    """
    values = _f32(values)
    old_values = tf.stop_gradient(_f32(old_values))
    returns = tf.stop_gradient(_f32(returns))
    clipped = old_values + tf.clip_by_value(values - old_values, -_f32(clip), _f32(clip))
    return 0.5 * tf.reduce_mean(tf.maximum(tf.square(values - returns), tf.square(clipped - returns)))


def approx_kl(log_prob, old_log_prob):
    """Estimate of KL(old || new) from samples of the old policy: mean((ratio - 1) - log ratio).

    Args:
      log_prob, old_log_prob: float32 [N], log-probs of the sampled actions under the new and old policy.
    Returns:
      float32 scalar >= 0 (each term is >= 0).
    Source: J. Schulman, "Approximating KL Divergence" (2020), the k3 estimator; CleanRL and
    Stable-Baselines3 log it as approx_kl.
    """
    log_ratio = _f32(log_prob) - _f32(old_log_prob)
    return tf.reduce_mean(tf.exp(log_ratio) - 1.0 - log_ratio)


def explained_variance(predictions, targets):
    """1 - Var(targets - predictions) / Var(targets) over all elements (float32 scalar; NaN if Var(targets) = 0).

    1: the value function predicts the returns perfectly; 0: no better than their mean; < 0: worse.
    Stable-Baselines3 and CleanRL log it for the value function against its targets.
    """
    predictions, targets = _f32(predictions), _f32(targets)
    var = tf.math.reduce_variance(targets)
    explained = 1.0 - tf.math.reduce_variance(targets - predictions) / tf.maximum(var, 1e-30)
    return tf.where(var > 0, explained, float("nan"))
