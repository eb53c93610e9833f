"""QDagger's settings and presets: DQN's plus the reincarnation ones."""

from __future__ import annotations

import dataclasses

from rlfleet.algorithms.base import Count, Count0, Fraction, NonNegative, Positive
from rlfleet.algorithms.dqn.config import ATARI, DQNConfig


@dataclasses.dataclass
class QDaggerConfig(DQNConfig):
    """A QDagger student: the DQN settings plus the reincarnation ones (reincarnating_rl configs).

    Units: `offline_steps` in gradient steps on the teacher's replay before any
    env step; `distillation_cutoff_env_steps` in online env steps (λ = 0 from
    then on; 0 = no cutoff). The learning rate moves from `learning_rate`
    (λ = base) to `learning_rate_final` (λ = 0) with λ/base; with base 0 it is
    `learning_rate` offline and `learning_rate_final` online. The large-margin
    weight decays as λ does (from `margin_coefficient`); the CQL term applies
    offline only. With `guide_roll_in_steps` H > 0 the teacher acts on the
    actors for the first steps of each episode (JSRL), H shrinking by
    `guide_roll_in_decay` every `guide_roll_in_period_env_steps` online env steps. The alternatives to
    QDagger (`rlfleet.algorithms.qdagger.methods`) are presets of these settings. The student starts
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
    epsilon_start: Fraction = 0.01  # actors' ε at env step 0 (qdagger's student starts competent: ε_end)
    random_eval_episodes: Count = 10  # episodes of a uniform-random policy for the status baseline
    teacher_eval_episodes: Count0 = 30  # episodes of the teacher's evaluation at start, λ's R_T (0: eval_episodes)
    distillation_score_episodes: Count0 = 30  # latest online eval episodes averaged to set λ (0: each evaluation alone)
    cql_coefficient: NonNegative = 0.0  # weight of the CQL term on the teacher's data, offline phase only (0: none)
    margin_coefficient: NonNegative = 0.0  # weight of DQfD's large-margin term toward the teacher's greedy action
    margin: Positive = 1.0  # the large-margin term's margin ℓ(a_T, a) for actions a ≠ a_T (reward units)
    teacher_data_ratio: Fraction = 0.0  # online: chance that a minibatch transition is the teacher's (rehearsal)
    guide_roll_in_steps: Count0 = 0  # JSRL: the teacher acts an episode's first h ~ U{1..this} env steps (0: never)
    guide_roll_in_decay: Fraction = 0.8  # JSRL: that bound becomes int(bound · this) every period below
    guide_roll_in_period_env_steps: Count0 = 125_000  # JSRL: online env steps between decays (0: never decays)

    def __post_init__(self):
        super().__post_init__()
        if self.teacher_data_ratio and self.prioritized:
            raise ValueError(
                f"teacher_data_ratio = {self.teacher_data_ratio} mixes the teacher's replay into the student's "
                "minibatches, which prioritized replay cannot weight; set prioritized = false or teacher_data_ratio "
                "= 0 in --set or the --config-file."
            )


QDAGGER_PRESETS = {"default": {}}
# QDagger students on small envs: a smaller network, a short warm-up, more replay per step (the
# reincarnation benchmark's settings; QDagger sets its own learning rate from λ). Distillation temperature
# τ = 1 (CleanRL's QDagger default) instead of reincarnating_rl's 0.1: these envs reward every step, so Q-values
# are ~1/(1 − γ) = 100 and a CartPole teacher's action gaps are small against them; at τ = 0.1 its softmax is
# all but one-hot, and fewer students reached the teacher after the offline phase than at τ = 1 (the docs'
# QDagger page).
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
    guide_roll_in_period_env_steps=2_500,
)
QDAGGER_ENV_OVERRIDES = {
    ("default", "CartPole-v1"): _QDAGGER_CLASSIC,
    ("default", "Acrobot-v1"): _QDAGGER_CLASSIC,
    ("default", "ALE/*"): ATARI,
}
