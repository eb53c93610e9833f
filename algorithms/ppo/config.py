"""BatchPPO's settings and presets.

`paper` holds the BatchPPO reference values (Hafner et al. 2017, reference configs): ReLU (200, 100) MLPs, a
tanh mean head, initial std 0.35, the KL-penalty objective with adaptive β and cutoff, rewards scaled by their
RMS, Adam 1e-4, 25 epochs on the whole batch, an update every 30 episodes, λ = 1, discount 0.995 (0.99 for
HalfCheetah).

`cleanrl` holds CleanRL's `ppo_continuous_action.py` details (see `_CLEANRL`).

`default` (the `PPOConfig` field defaults) is the configuration chosen on the learning suite (docs: the PPO
page and the benchmarks): tanh (64, 64) MLPs with a linear mean head initialised near 0 and initial std 1, the
clipped objective (Schulman et al. 2017) with gradients clipped to norm 0.5, unscaled rewards, GAE λ 0.95, Adam
3e-4 annealed linearly to 0 at --total-steps (as CleanRL), an update every 2048 env steps in 32 minibatches ×
10 epochs, observations normalised and clipped to ±5. These are the Stable-Baselines3 / CleanRL PPO defaults
where they differ from BatchPPO's; the parts for asynchronous collection (decoupled proximal policy, the
policy-lag limit, actors held to it by `actor_credit`) are rlfleet's.
"""

from __future__ import annotations

import dataclasses
import json

from rlfleet.algorithms.base import Count, Count0, Discount, Fraction, LrSchedule, NonNegative, OneOf, Positive, Widths
from rlfleet.algorithms.library.policy import ACTIVATIONS
from rlfleet.algorithms.ppo.policy import MEAN_HEADS

# The named-choice settings' types (`OneOf`: any other value is refused before a run starts).
Activation = OneOf(*ACTIVATIONS)
MeanHead = OneOf(*MEAN_HEADS)
PolicyObjective = OneOf("kl_penalty", "clip")
OffPolicy = OneOf("decoupled", "behaviour", "uncorrected")
Traces = OneOf("none", "ratio")
RewardScale = OneOf("rms", "return", "none")
Init = OneOf("variance_scaling", "orthogonal")
AdvantageNorm = OneOf("batch", "minibatch", "none")


@dataclasses.dataclass
class PPOConfig:
    """All BatchPPO settings of a run; every field's comment gives its meaning and unit.

    An update starts when either trigger is reached (`batch_env_steps` or
    `batch_episodes`; 0 turns a trigger off).
    """

    policy_hidden: Widths = (64, 64)  # policy MLP hidden layer widths (units)
    value_hidden: Widths = (64, 64)  # value MLP hidden layer widths (units)
    activation: Activation = "tanh"  # hidden-layer activation of both MLPs: relu (BatchPPO) or tanh
    mean_head: MeanHead = "linear"  # policy mean = tanh(MLP) (BatchPPO) or the MLP output ("linear")
    init_std: Positive = 1.0  # initial std of the Gaussian policy (action units, [-1, 1] scale)
    mean_init_factor: Positive = 1e-4  # variance-scaling factor of the mean head's initial weights
    learning_rate: Positive = 3e-4  # Adam step size, policy and value (per gradient step)
    lr_schedule: LrSchedule = "linear"  # linear: over the env steps trained on, to lr_final_fraction; or constant
    lr_final_fraction: Fraction = 0.0  # linear schedule: the learning rate at the budget, as a fraction (0: CleanRL)
    epochs: Count = 10  # passes over each update batch
    num_minibatches: Count = 32  # gradient steps per epoch (the batch is split into this many)
    batch_env_steps: Count0 = 2048  # env steps per update (0: trigger by episodes only)
    batch_episodes: Count0 = 0  # finished episodes per update (0: trigger by env steps only)
    discount: Discount = 0.99  # γ per env step
    gae_lambda: Fraction = 0.95  # GAE λ (1: discounted return − V, the BatchPPO advantage)
    policy_objective: PolicyObjective = "clip"  # clip (PPO-clip) or kl_penalty (BatchPPO: adaptive β, cutoff)
    kl_target: Positive = 0.01  # KL(π_old‖π_new) per update that β steers toward (nats)
    kl_cutoff_factor: Positive = 2.0  # the quadratic cutoff starts at this multiple of kl_target
    kl_cutoff_coef: NonNegative = 1000.0  # weight of the quadratic KL cutoff term
    init_beta: Positive = 1.0  # initial KL penalty coefficient β
    clip_epsilon: Positive = 0.2  # PPO-clip: the ratio is clipped to [1 − ε, 1 + ε]
    max_importance_weight: Positive = 2.0  # truncation of π_proximal/π_behaviour weights (off-policy data)
    off_policy_objective: OffPolicy = "decoupled"  # PPO ratio anchor for lagged data: decoupled, behaviour, uncorrected
    advantage_traces: Traces = "none"  # GAE on lagged data: none (as collected), ratio (later steps × truncated π/π_b)
    max_grad_norm: NonNegative = 0.5  # clip each gradient to this global norm (0: no clipping)
    target_kl: NonNegative = 0.0  # update stops once a minibatch's approx KL from its start > 1.5× this (nats; 0: off)
    obs_normalization: bool = True  # observations − running mean, ÷ running std (False: raw, unclipped)
    obs_clip: Positive = 5.0  # normalised observations are clipped to ±obs_clip (std units)
    reward_scale: RewardScale = "none"  # rewards ÷ RMS of rewards (rms, BatchPPO), ÷ std of returns, or none
    reward_clip: Positive = 10.0  # scaled rewards (rms, return) are clipped to ±reward_clip
    max_policy_lag: Count0 = 3  # items older than this many policy versions are dropped (asynchronous mode)
    synchronous: bool = False  # each batch is collected only with the policy version it trains (on-policy PPO)
    actor_credit: bool = True  # asynchronous: actors write at most max_policy_lag + 1 batch shares ahead (none dropped)
    init: Init = "variance_scaling"  # network initialisation: variance_scaling, or orthogonal (CleanRL's gains)
    adam_epsilon: Positive = 1e-7  # Adam ε, added to √(second moment) before bias correction (Keras' default)
    shared_optimizer: bool = False  # one Adam on policy + value_loss_coef × value loss, one gradient clip
    value_loss_coef: Positive = 0.5  # weight of the value loss in the shared optimizer's loss (shared only)
    value_clip: NonNegative = 0.0  # V − V_old clipped to ±value_clip in a second value loss, the larger kept (0: none)
    advantage_norm: AdvantageNorm = "batch"  # advantages normalised over the whole batch, each minibatch, or none
    envs_per_actor: Count = 8  # envs each actor steps as one batch
    unroll_length: Count = 64  # batch steps per replay item (T; items hold T + 1)
    eval_episodes: Count = 10  # episodes per evaluation (mean action)
    eval_every_updates: Count = 10  # updates (policy versions) between evaluations

    def __post_init__(self):
        if self.batch_env_steps <= 0 and self.batch_episodes <= 0:
            raise ValueError(
                "PPO batch_env_steps and batch_episodes are both 0: no update would ever start (and every item "
                "would be kept). Set one of them, e.g. batch_env_steps=2048, in --set or the --config-file."
            )
        if self.synchronous and (self.batch_env_steps <= 0 or self.batch_episodes):
            raise ValueError(
                f"PPO synchronous=true needs a batch of env steps (batch_env_steps > 0, now "
                f"{self.batch_env_steps}) and no episode trigger (batch_episodes = 0, now "
                f"{self.batch_episodes}): the actors' share of a batch is counted in env steps. "
                "Fix them in --set or the --config-file."
            )

        if self.off_policy_objective == "behaviour" and self.policy_objective == "kl_penalty":
            raise ValueError(
                "PPO off_policy_objective=behaviour needs policy_objective=clip: the KL penalty is taken to the "
                "learner's policy, whose distribution is known, not to the behaviour policy's (only its "
                "log-probabilities are stored). Set off_policy_objective=decoupled or policy_objective=clip."
            )

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)


# The BatchPPO reference configuration (Hafner et al. 2017, reference configs), every value spelled out.
_BATCHPPO = dict(
    policy_hidden=(200, 100),
    value_hidden=(200, 100),
    activation="relu",
    mean_head="tanh",
    init_std=0.35,
    mean_init_factor=0.1,
    policy_objective="kl_penalty",
    max_grad_norm=0.0,
    reward_scale="rms",
    lr_schedule="constant",
    max_policy_lag=2,
    learning_rate=1e-4,
    epochs=25,
    num_minibatches=1,
    batch_env_steps=0,
    batch_episodes=30,
    gae_lambda=1.0,
    discount=0.995,
    envs_per_actor=30,
    unroll_length=100,
)

# CleanRL's `ppo_continuous_action.py` (vwxyzjn/cleanrl), detail by detail as "The 37 Implementation Details of
# Proximal Policy Optimization" (Huang et al., ICLR 2022 blog track) lists them: tanh (64, 64) MLPs with orthogonal
# initialisation (gains √2, policy head 0.01, value head 1), state-independent std starting at 1, Adam ε 1e-5 and
# learning rate 3e-4 annealed linearly to 0, one optimizer over policy loss + 0.5 × value loss with one global
# gradient clip at 0.5, the clipped value loss (0.2), advantages normalised per minibatch, GAE λ 0.95, γ 0.99,
# PPO-clip 0.2, no entropy bonus, observations normalised and clipped to ±10, rewards divided by the running std
# of the discounted return and clipped to ±10, actions clipped to the bounds, one env of 2048 steps per update in
# 32 minibatches × 10 epochs, here as the equivalent batch of 8 envs × 256 steps (an actor's cost per batch step
# is mostly fixed, so one env per actor collects several times slower per env step). Where rlfleet's design differs:
# - the observation and return statistics are updated at the learner once per update (from the batch's
#   observations and the returns the actors write), not by each env at every step; the actors act with the
#   statistics that came with their weights;
# - a time limit is not a terminal state here: a truncated episode bootstraps from V(final observation), where
#   CleanRL treats truncation as termination; the return statistics restart at every episode end;
# - the batch is collected asynchronously unless `synchronous = true` (the on-policy control); collected
#   asynchronously, each actor's share of a batch is one long item, so every item an actor writes ahead of the
#   learner is a policy version of lag (`actor_credit` keeps it within `max_policy_lag`);
# - Keras' Adam adds ε to the root of the second moment before its bias correction (PyTorch's after), so the same
#   ε weighs more in the first few hundred gradient steps;
# - the policy acts in [-1, 1], mapped linearly onto the env's action bounds, where CleanRL samples in the env's
#   units and clips: the same on envs whose bounds are ±1, but on Humanoid-v5 (±0.4) CleanRL's initial std of 1
#   puts most sampled actions at a bound, where here it spans the range as on the others.
_CLEANRL = dict(
    policy_hidden=(64, 64),
    value_hidden=(64, 64),
    activation="tanh",
    mean_head="linear",
    init="orthogonal",
    init_std=1.0,
    learning_rate=3e-4,
    lr_schedule="linear",
    lr_final_fraction=0.0,
    adam_epsilon=1e-5,
    shared_optimizer=True,
    value_loss_coef=0.5,
    max_grad_norm=0.5,
    value_clip=0.2,
    advantage_norm="minibatch",
    policy_objective="clip",
    clip_epsilon=0.2,
    epochs=10,
    num_minibatches=32,
    batch_env_steps=2048,
    batch_episodes=0,
    discount=0.99,
    gae_lambda=0.95,
    obs_normalization=True,
    obs_clip=10.0,
    reward_scale="return",
    reward_clip=10.0,
    envs_per_actor=8,
    unroll_length=256,
)

PRESETS = {
    "default": {},  # the PPOConfig field defaults (see the module doc)
    "paper": _BATCHPPO,
    "cleanrl": _CLEANRL,
}

# Per-environment overrides applied on top of a preset (the docs' PPO page has the runs behind each).
# paper / HalfCheetah: the reference config's own discount for it.
# default / InvertedPendulum: evaluations twice as often (an episode is short, and the 10-episode
# evaluation shows the oscillation between solved and not that PPO has on it).
# default / Ant-v5: raw observations. Its 105-dim observation is 78 contact-force dims (24 always 0, most
# others near 0) plus 27 joint dims; normalised, Ant-v5 learned several times less by 300k env steps, and a
# floor on the normaliser's std did not help. On HalfCheetah and Humanoid raw observations were worse, so
# it stays per env.
# default / Swimmer-v5: γ 0.9999. Swimmer's reward is forward speed and it never terminates; the gait that
# swims pays off over hundreds of steps, so γ 0.99 (a ~100-step horizon) settles on a slow local optimum.
# Franceschetti et al. 2022 ("Making Reinforcement Learning Work on Swimmer") trace this to the discount,
# and the RL Baselines3 Zoo's PPO uses 0.9999 for it. With that discount the rewards are divided by the
# std of the discounted return as well: a discount near 1 makes V(s) the sum of thousands of steps' rewards
# while an action's advantage is a few steps' worth, so the value's relative error must be far smaller than at
# γ 0.99; in return-std units the value net leaves less of the return's variance unexplained, and the runs
# hold their gait to the end of the budget (the learning suite page has the runs).
ENV_OVERRIDES = {
    ("paper", "HalfCheetah-v5"): dict(discount=0.99),
    ("default", "InvertedPendulum-v5"): dict(eval_every_updates=5),
    ("default", "Ant-v5"): dict(obs_normalization=False),
    ("default", "Swimmer-v5"): dict(discount=0.9999, reward_scale="return"),
}


def make_config(preset: str, env_id: str, overrides: dict | None = None) -> PPOConfig:
    """The PPO preset's values, then the per-env overrides, then explicit `overrides`.

    Raises:
        ValueError: unknown preset, or an override key that is not a PPOConfig field.
    """
    from rlfleet.algorithms.settings import make_algo_config

    return make_algo_config("ppo", preset, env_id, overrides)
