"""Hyperparameter presets of BatchPPO, DQN and QDagger.

PPO `cleanrl` holds CleanRL's `ppo_continuous_action.py` details (see `_CLEANRL`).
PPO `paper` holds the BatchPPO reference values (Hafner et al. 2017, reference
configs): ReLU (200, 100) MLPs, a tanh mean head, initial std 0.35, the
KL-penalty objective with adaptive β and cutoff, rewards scaled by their RMS,
Adam 1e-4, 25 epochs on the whole batch, an update every 30 episodes, λ = 1,
discount 0.995 (0.99 for HalfCheetah).

PPO `default` is the configuration that learned the MuJoCo suite best on a
2-core machine (benchmarks/README.md, "The learning suite"): tanh (64, 64)
MLPs with a linear mean head initialised near 0 and initial std 1 (wide
exploration: with BatchPPO's std 0.35 Hopper-v5 settled on standing still,
about 200, in every seed), the clipped objective (Schulman et al. 2017) with
gradients clipped to norm 0.5, unscaled rewards (with rewards ÷ their RMS
Hopper reached about 1,000 at 300k env steps in two seeds, unscaled 2,889 and
967), GAE λ 0.95, Adam 3e-4 annealed linearly to 0 at --total-steps (as CleanRL; with a
constant step size InvertedPendulum-v5 held 1,000 from 200k to 750k env steps and then collapsed to
190 at 1M as the std shrank to 0.05), an update every 2048 env steps in 32 minibatches
× 10 epochs, observations normalised and clipped to ±5. These are the
Stable-Baselines3 / CleanRL PPO defaults in the places where they differ from
BatchPPO's; the async-specific parts (decoupled proximal policy, policy-lag
limit) are rlfleet's. Data up to 3 policy versions old is kept, and actors run
no further ahead (`actor_credit`): with a limit of 2 and no credit, HalfCheetah-v5
dropped 15% of its env steps and reached 1,910 at 1M (seed 0), with 3 it
dropped none and reached 3,132. ReLU (256, 256) networks with the linear head
reached 4,281 on HalfCheetah but diverged on Hopper (NaN actions).
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import json
import math
import textwrap
import tokenize
import typing
from typing import Annotated

from rlfleet.actors.policy import ACTIVATIONS, MEAN_HEADS


@dataclasses.dataclass(frozen=True)
class Range:
    """The valid values of a numeric setting: finite, from `low` to `high` (None: unbounded), each bound included
    unless its `*_open` is set; for a tuple setting (layer widths), every element, and at least one. A config
    field declares it in its type, `typing.Annotated[float, Range(...)]` (the aliases below), and `build_config`
    refuses any value outside it before anything starts."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value) -> bool:
        values = value if isinstance(value, tuple) else (value,)
        return bool(values) and all(self._holds(v) for v in values)

    def _holds(self, v) -> bool:
        if not math.isfinite(v):
            return False
        if self.low is not None and (v < self.low or (self.low_open and v == self.low)):
            return False
        return self.high is None or (v < self.high or (not self.high_open and v == self.high))

    def __str__(self) -> str:
        if self.low is not None and self.high is not None:
            return f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        if self.high is not None:
            return f"{'<' if self.high_open else '<='} {self.high:g}"
        return "finite"


# The ranges settings are declared with (each field's comment says what a bound value such as 0 means).
Positive = Annotated[float, Range(0, low_open=True)]  # > 0
NonNegative = Annotated[float, Range(0)]  # >= 0
Fraction = Annotated[float, Range(0, 1)]  # in [0, 1]
Discount = Annotated[float, Range(0, 1, low_open=True)]  # γ in (0, 1]
Count = Annotated[int, Range(1)]  # >= 1
Count0 = Annotated[int, Range(0)]  # >= 0
Widths = Annotated[tuple, Range(1)]  # layer widths: at least one, each >= 1
# Settings the learner service reads from every algorithm's config: their ranges hold for a config class that
# declares none (an algorithm plugin's plain `int` fields).
SERVICE_RANGES = {name: Range(1) for name in ("envs_per_actor", "unroll_length", "eval_episodes", "eval_every_updates")}


def ranges(cls) -> dict[str, Range]:
    """The declared `Range` of each field of the config dataclass `cls` (`SERVICE_RANGES` where it declares
    none)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    out = {}
    for f in dataclasses.fields(cls):
        declared = [m for m in getattr(hints.get(f.name), "__metadata__", ()) if isinstance(m, Range)]
        if declared:
            out[f.name] = declared[0]
        elif f.name in SERVICE_RANGES:
            out[f.name] = SERVICE_RANGES[f.name]
    return out


@dataclasses.dataclass
class PPOConfig:
    """All BatchPPO settings of a run; every field's comment gives its meaning and unit.

    An update starts when either trigger is reached (`batch_env_steps` or
    `batch_episodes`; 0 turns a trigger off).
    """

    policy_hidden: Widths = (64, 64)  # policy MLP hidden layer widths (units)
    value_hidden: Widths = (64, 64)  # value MLP hidden layer widths (units)
    activation: str = "tanh"  # hidden-layer activation of both MLPs: relu (BatchPPO) or tanh
    mean_head: str = "linear"  # policy mean = tanh(MLP) (BatchPPO) or the MLP output ("linear")
    init_std: Positive = 1.0  # initial std of the Gaussian policy (action units, [-1, 1] scale)
    mean_init_factor: Positive = 1e-4  # variance-scaling factor of the mean head's initial weights
    learning_rate: Positive = 3e-4  # Adam step size, policy and value (per gradient step)
    lr_schedule: str = "linear"  # linear: over the env steps trained on, to lr_final_fraction; or constant
    lr_final_fraction: Fraction = 0.0  # linear schedule: the learning rate at the budget, as a fraction (0: CleanRL)
    epochs: Count = 10  # passes over each update batch
    num_minibatches: Count = 32  # gradient steps per epoch (the batch is split into this many)
    batch_env_steps: Count0 = 2048  # env steps per update (0: trigger by episodes only)
    batch_episodes: Count0 = 0  # finished episodes per update (0: trigger by env steps only)
    discount: Discount = 0.99  # γ per env step
    gae_lambda: Fraction = 0.95  # GAE λ (1: discounted return − V, the BatchPPO advantage)
    policy_objective: str = "clip"  # clip (PPO-clip) or kl_penalty (BatchPPO: adaptive β, cutoff)
    kl_target: Positive = 0.01  # KL(π_old‖π_new) per update that β steers toward (nats)
    kl_cutoff_factor: Positive = 2.0  # the quadratic cutoff starts at this multiple of kl_target
    kl_cutoff_coef: NonNegative = 1000.0  # weight of the quadratic KL cutoff term
    init_beta: Positive = 1.0  # initial KL penalty coefficient β
    clip_epsilon: Positive = 0.2  # PPO-clip: the ratio is clipped to [1 − ε, 1 + ε]
    max_importance_weight: Positive = 2.0  # truncation of π_proximal/π_behaviour weights (off-policy data)
    off_policy_objective: str = "decoupled"  # PPO ratio anchor for lagged data: decoupled, behaviour, uncorrected
    advantage_traces: str = "none"  # GAE on lagged data: none (as collected), ratio (later steps × truncated π/π_b)
    max_grad_norm: NonNegative = 0.5  # clip each gradient to this global norm (0: no clipping)
    target_kl: NonNegative = 0.0  # update stops once a minibatch's approx KL from its start > 1.5× this (nats; 0: off)
    obs_normalization: bool = True  # observations − running mean, ÷ running std (False: raw, unclipped)
    obs_clip: Positive = 5.0  # normalised observations are clipped to ±obs_clip (std units)
    reward_scale: str = "none"  # rewards ÷ RMS of rewards (rms, BatchPPO), ÷ std of returns, or none
    reward_clip: Positive = 10.0  # scaled rewards (rms, return) are clipped to ±reward_clip
    max_policy_lag: Count0 = 3  # items older than this many policy versions are dropped (asynchronous mode)
    synchronous: bool = False  # each batch is collected only with the policy version it trains (on-policy PPO)
    actor_credit: bool = True  # asynchronous: actors write at most max_policy_lag + 1 batch shares ahead (none dropped)
    init: str = "variance_scaling"  # network initialisation: variance_scaling, or orthogonal (CleanRL's gains)
    adam_epsilon: Positive = 1e-7  # Adam ε, added to √(second moment) before bias correction (Keras' default)
    shared_optimizer: bool = False  # one Adam on policy + value_loss_coef × value loss, one gradient clip
    value_loss_coef: Positive = 0.5  # weight of the value loss in the shared optimizer's loss (shared only)
    value_clip: NonNegative = 0.0  # V − V_old clipped to ±value_clip in a second value loss, the larger kept (0: none)
    advantage_norm: str = "batch"  # advantages normalised over the whole batch, each minibatch, or none
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
#   ε weighs more in the first few hundred gradient steps.
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

# Per-environment overrides applied on top of a preset.
# paper / HalfCheetah: the reference config's own discount for it.
# default / InvertedPendulum: evaluations twice as often (an episode is short, and the 10-episode
# evaluation shows the oscillation between solved and not that PPO has on it).
# default / Ant-v5: raw observations. Its 105-dim observation is 78 contact-force dims (24 always 0,
# most others near 0) plus 27 joint dims; normalised, Ant-v5 evaluated 148 and 327 at 300k env steps
# (seeds 0, 1), raw 833 and 743. A floor of 0.1 on the normaliser's std (so near-zero dims are not
# blown up to unit scale) did not help (128), so the cause is not the contact spikes alone. On
# HalfCheetah (654 vs 1545) and Humanoid (466 vs 543) raw observations were worse, so it stays per env
# (benchmarks/README.md, "The learning suite").
# default / Swimmer-v5: γ 0.9999. Swimmer's reward is forward speed and it never terminates; the gait
# that swims pays off over hundreds of steps, so γ 0.99 (a ~100-step horizon) settles on a slow local
# optimum (31 at 300k env steps, seed 0). Franceschetti et al. 2022 ("Making Reinforcement Learning
# Work on Swimmer") trace this to the discount, and the RL Baselines3 Zoo's PPO uses 0.9999 for it.
ENV_OVERRIDES = {
    ("paper", "HalfCheetah-v5"): dict(discount=0.99),
    ("default", "InvertedPendulum-v5"): dict(eval_every_updates=5),
    ("default", "Ant-v5"): dict(obs_normalization=False),
    ("default", "Swimmer-v5"): dict(discount=0.9999),
}


# Settings that take one of a few named values.
CHOICES = {
    "policy_objective": ("kl_penalty", "clip"),
    "activation": ACTIVATIONS,
    "mean_head": MEAN_HEADS,
    "reward_scale": ("rms", "return", "none"),
    "lr_schedule": ("constant", "linear"),
    "init": ("variance_scaling", "orthogonal"),
    "advantage_norm": ("batch", "minibatch", "none"),
    "off_policy_objective": ("decoupled", "behaviour", "uncorrected"),
    "advantage_traces": ("none", "ratio"),
}


def build_config(algorithm, preset: str, env_id: str, overrides: dict | None = None):
    """`algorithm`'s settings (`rlfleet.algorithms.Algorithm`): its preset's values, then its per-env
    overrides, then `overrides`, checked against its config dataclass (names, types, choices, the declared
    `Range` of each numeric setting, and the checks across settings its `__post_init__` makes).

    Raises:
        ValueError: naming the setting, what is wrong and the fix.
    """
    cls, name = algorithm.part("config_class"), algorithm.name
    presets, env_overrides = algorithm.part("presets"), algorithm.part("env_overrides")
    if preset not in presets:
        raise ValueError(f"unknown --config preset {preset!r} for {name}; choose one of {sorted(presets)}.")
    per_env = env_overrides.get((preset, env_id))
    if per_env is None and env_id.startswith("ALE/"):
        per_env = env_overrides.get((preset, "ALE/*"))
    values = {**presets[preset], **(per_env or {}), **(overrides or {})}
    fields = {f.name: f for f in dataclasses.fields(cls)}
    valid = ranges(cls)
    bad = sorted(set(values) - set(fields))
    if bad:
        raise ValueError(f"unknown {name.upper()} setting(s) {bad}; valid settings: {sorted(fields)}.")
    for k, v in values.items():  # JSON overrides give lists where the config holds tuples
        if isinstance(v, list) and isinstance(fields[k].default, tuple):
            values[k] = v = tuple(v)
        _check_type(name, k, v, fields[k].default)
        if k in CHOICES and v not in CHOICES[k]:
            raise ValueError(
                f"{name.upper()} setting {k} = {v!r}: choose one of {list(CHOICES[k])}; "
                "fix it in --set or the --config-file."
            )
        if k in valid and v not in valid[k]:
            what = describe(cls).get(k)
            must = f"a non-empty list, each element {valid[k]}" if isinstance(v, tuple) else str(valid[k])
            raise ValueError(
                f"{name.upper()} setting {k} = {v!r}: must be {must}"
                + (f" ({what})" if what else "")
                + "; fix it in --set or the --config-file."
            )
    unused = sorted(set(overrides or {}) & set(algorithm.unused_settings))
    if unused:
        reason = f" ({algorithm.unused_reason})" if algorithm.unused_reason else ""
        raise ValueError(f"{name.upper()} does not use {unused}{reason}; remove them.")
    return cls(**values)


def _check_type(name: str, key: str, value, default) -> None:
    """Raises ValueError when `value` cannot stand for a setting whose default is `default`."""
    kind = type(default)
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif kind is tuple:
        ok = (
            isinstance(value, tuple) and all(isinstance(x, type(default[0])) for x in value)
            if default
            else isinstance(value, tuple)
        )
    else:
        ok = isinstance(value, kind)
    if not ok:
        want = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(
            kind
        ) or f"a list like {list(default)}"
        raise ValueError(
            f"{name.upper()} setting {key} = {value!r}: expected {want} (default {default!r}); "
            "fix it in --set or the --config-file."
        )


def make_config(preset: str, env_id: str, overrides: dict | None = None) -> PPOConfig:
    """The PPO preset's values, then the per-env overrides, then explicit `overrides`.

    Raises:
        ValueError: unknown preset, or an override key that is not a PPOConfig field.
    """
    return make_algo_config("ppo", preset, env_id, overrides)


@dataclasses.dataclass
class DQNConfig:
    """All DQN settings of a run.

    Defaults follow the reincarnating_rl / Dopamine DQN configs where they
    apply to any env (n-step 3, γ 0.99, Adam eps 1.5e-4, batch 32, Huber loss);
    the `default` preset's per-env overrides size the rest for small envs.
    Units: `*_env_steps` in env (agent) steps summed over all actors;
    `target_update_period` and `publish_every` in learner (gradient) steps.
    `samples_per_insert` = batch_size / (env steps per gradient step): the
    replay ratio the Reverb `SampleToInsertRatio` rate limiter holds however
    many actors are attached.
    """

    hidden: Widths = (256, 256)  # MLP Q-network hidden widths (units); Atari uses the Nature CNN
    n_step: Count = 3  # steps of reward before the bootstrap (n-step targets)
    discount: Discount = 0.99  # γ per env step
    learning_rate: Positive = 1e-4  # Adam step size (per gradient step)
    adam_epsilon: Positive = 1.5e-4  # Adam ε, added to the root of the second-moment estimate
    batch_size: Count = 32  # items per gradient step
    samples_per_insert: Positive = 8.0  # items sampled per item inserted (batch_size × learner steps per env step)
    replay_size: Count = 1_000_000  # replay capacity (items = env steps); oldest removed first
    min_replay_size: Count = 20_000  # items in replay before the first gradient step
    target_update_period: Count = 2000  # learner steps between target-network copies
    publish_every: Count = 100  # learner steps between weights versions pushed to actors
    epsilon_start: Fraction = 1.0  # actors' ε at env step 0
    epsilon_end: Fraction = 0.01  # actors' ε after the decay
    epsilon_decay_env_steps: Count0 = 250_000  # env steps (all actors) over which ε decays linearly
    epsilon_eval: Fraction = 0.001  # ε of the evaluation policy
    envs_per_actor: Count = 8  # envs each actor steps as one batch
    eval_episodes: Count = 10  # episodes per evaluation
    eval_every_updates: Count = 20  # weights versions between evaluations
    prioritized: bool = False  # prioritized replay sampling (else uniform)
    priority_exponent: NonNegative = 0.6  # prioritized sampling exponent α
    reward_clip: NonNegative = 0.0  # TD targets use rewards clipped to ±reward_clip (0: unclipped)
    double_q: bool = False  # bootstrap with Q_target(s', argmax Q_online(s')) (van Hasselt et al. 2016)
    lr_schedule: str = "constant"  # constant, or linear: to lr_final_fraction × learning_rate at --total-steps
    lr_final_fraction: Fraction = 0.0  # linear schedule: the learning rate at the budget, as a fraction

    def __post_init__(self):
        if self.min_replay_size > self.replay_size:
            raise ValueError(
                f"min_replay_size = {self.min_replay_size} is above replay_size = {self.replay_size}: the "
                "replay would never hold enough items to start learning. Lower min_replay_size or raise "
                "replay_size in --set or the --config-file."
            )

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)


DQN_PRESETS = {"default": {}}
# Classic control (CartPole-v1, Acrobot-v1, MountainCar-v0): the RL Baselines3 Zoo's tuned DQN values for each
# env (network 256-256, learning rate, batch, replay size, target period, ε schedule, γ), with two changes
# that make the *last* network a good one more often, not just the best evaluation on the way: double-Q
# bootstrapping and a learning rate annealed to 0 at --total-steps (without them CartPole evaluated at 500 for
# most of a 100k-step run and ended at 341; with them it still oscillates between 500 and drops, so a run's
# final return varies: benchmarks/README.md). The zoo's replay ratio is kept at or halved to 0.5 gradient steps per
# env step (the 2-core learner's limit): samples_per_insert = batch × 0.5. Our targets are 3-step.
_CLASSIC = dict(
    hidden=(256, 256), double_q=True, lr_schedule="linear", publish_every=50, envs_per_actor=4, eval_every_updates=10
)
_CARTPOLE = dict(
    _CLASSIC,
    learning_rate=2.3e-3,
    batch_size=64,
    samples_per_insert=32.0,
    replay_size=100_000,
    min_replay_size=1000,
    target_update_period=128,
    epsilon_decay_env_steps=8000,
    epsilon_end=0.04,
)
_ACROBOT = dict(
    _CLASSIC,
    learning_rate=6.3e-4,
    batch_size=128,
    samples_per_insert=64.0,
    replay_size=50_000,
    min_replay_size=1000,
    target_update_period=250,
    epsilon_decay_env_steps=12_000,
    epsilon_end=0.1,
)
_MOUNTAINCAR = dict(
    _CLASSIC,
    learning_rate=4e-3,
    batch_size=128,
    samples_per_insert=64.0,
    replay_size=10_000,
    min_replay_size=1000,
    discount=0.98,
    target_update_period=300,
    epsilon_decay_env_steps=24_000,
    epsilon_end=0.07,
)
# Atari (any ALE/ id): the DQNConfig defaults are the reincarnating_rl / Dopamine Atari values;
# rewards are clipped to ±1 for learning (episode returns stay unclipped), and evaluation
# (8 episodes, one per env in parallel) runs every 100 policy versions (40k agent steps).
_ATARI = dict(reward_clip=1.0, eval_episodes=8, eval_every_updates=100)
DQN_ENV_OVERRIDES = {
    ("default", "CartPole-v1"): _CARTPOLE,
    ("default", "Acrobot-v1"): _ACROBOT,
    ("default", "MountainCar-v0"): _MOUNTAINCAR,
    ("default", "ALE/*"): _ATARI,
}


@dataclasses.dataclass
class QDaggerConfig(DQNConfig):
    """A QDagger student: the DQN settings plus the reincarnation ones (reincarnating_rl configs).

    Units: `offline_steps` in gradient steps on the teacher's replay before any
    env step; `distillation_cutoff_env_steps` in online env steps (λ = 0 from
    then on; 0 = no cutoff). The learning rate moves from `learning_rate`
    (λ = base) to `learning_rate_final` (λ = 0) with λ/base. The student starts
    from the teacher's competence, so ε starts at `epsilon_start` = ε_end.
    λ is set only from online evaluations, from the mean return of the latest
    `distillation_score_episodes` evaluation episodes (λ holds its value until
    that many were played): reincarnating_rl decays λ once per 250k-agent-step
    iteration from a 125k-agent-step evaluation, never from pretraining scores.
    """

    learning_rate_final: Positive = 1e-5  # Adam step size once λ reaches 0 (per gradient step)
    offline_steps: Count0 = 100_000  # gradient steps on the teacher's replay before any env step
    distillation_base: NonNegative = 3.0  # λ, the distillation coefficient, at the start of the online phase
    distillation_temperature: Positive = 0.1  # τ of the teacher's softmax over Q-values (reward units)
    distillation_cutoff_env_steps: Count0 = 1_000_000  # online env steps after which λ = 0 (0: no cutoff)
    epsilon_start: Fraction = 0.01  # actors' ε at env step 0 (the student starts competent: ε_end)
    random_eval_episodes: Count = 10  # episodes of a uniform-random policy for the status baseline
    teacher_eval_episodes: Count0 = 30  # episodes of the teacher's evaluation at start, λ's R_T (0: eval_episodes)
    distillation_score_episodes: Count0 = 30  # latest online eval episodes averaged to set λ (0: each evaluation alone)


QDAGGER_PRESETS = {"default": {}}
# QDagger students on small envs: a smaller network, a short warm-up, more replay per step (the
# reincarnation benchmark's settings; QDagger sets its own learning rate from λ). Distillation temperature
# τ = 1 (CleanRL's QDagger default) instead of reincarnating_rl's 0.1: these envs reward every step, so Q-values
# are ~1/(1 − γ) = 100 and a CartPole teacher's action gaps ~0.02-9; at τ = 0.1 its softmax is all but one-hot,
# and after the 3,000 offline steps' evaluations 36 of 54 reached 0.9 of the teacher (9 CartPole teachers; one
# student's 6 all at 147-301 of a 500 teacher), at τ = 1 52 of 54; on Acrobot both reached an R_T of −84.6
# (τ = 1: −81 to −94) (benchmarks/README.md, "QDagger's offline phase").
_QDAGGER_CLASSIC = dict(
    hidden=(128, 128),
    learning_rate=2.5e-4,
    learning_rate_final=2.5e-5,
    batch_size=64,
    samples_per_insert=16.0,
    replay_size=50_000,
    min_replay_size=500,
    target_update_period=500,
    publish_every=50,
    epsilon_start=0.05,
    epsilon_decay_env_steps=20_000,
    epsilon_end=0.05,
    envs_per_actor=4,
    eval_every_updates=10,
    offline_steps=3000,
    distillation_temperature=1.0,
    distillation_cutoff_env_steps=50_000,
)
QDAGGER_ENV_OVERRIDES = {
    ("default", "CartPole-v1"): _QDAGGER_CLASSIC,
    ("default", "Acrobot-v1"): _QDAGGER_CLASSIC,
    ("default", "ALE/*"): _ATARI,
}


def describe(cls) -> dict[str, str]:
    """Each field of the config dataclass `cls` -> the one-line description on its declaration.

    The description is the comment that ends the field's declaration (tokenized, so a '#' inside a default
    string is not one; noqa/type:/fmt: pragmas are skipped); a subclass's wins over its base's. A field
    without one maps to "" (tests/test_show_config.py fails on that).
    """
    found = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        own = klass.__dict__.get("__annotations__", {})
        source = textwrap.dedent(inspect.getsource(klass))
        line = []  # the tokens of the current logical line
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.NEWLINE:
                code = [t for t in line if t.type != tokenize.COMMENT]
                notes = [t.string.lstrip("#").strip() for t in line if t.type == tokenize.COMMENT]
                notes = [n for n in notes if n and not n.startswith(("noqa", "type:", "fmt:"))]
                if len(code) > 1 and code[0].string in own and code[1].string == ":" and notes:
                    found[code[0].string] = notes[-1]
                line = []
            elif tok.type == tokenize.NL and all(t.type == tokenize.COMMENT for t in line):
                line = []  # a blank or comment-only line belongs to no declaration
            elif tok.type not in (tokenize.INDENT, tokenize.DEDENT, tokenize.NL):
                line.append(tok)
    return {f.name: found.get(f.name, "") for f in dataclasses.fields(cls)}


def make_algo_config(algo: str, preset: str, env_id: str, overrides: dict | None = None):
    """The settings of a run of the registered algorithm `algo` (`rlfleet.algorithms.Algorithm.make_config`).

    Raises:
        ValueError: unknown algorithm (UnknownAlgorithmError), preset or setting.
    """
    from rlfleet import algorithms

    return algorithms.get(algo).make_config(preset, env_id, overrides)
