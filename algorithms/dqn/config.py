"""DQN's settings and presets."""

from __future__ import annotations

import dataclasses
import json

from rlfleet.algorithms.base import (
    Count,
    Count0,
    Discount,
    Fraction,
    LrSchedule,
    NonNegative,
    OneOf,
    Positive,
    Widths,
)

# The Q-networks: an MLP (`hidden`), the Nature CNN (Mnih et al. 2015) or the Impala CNN (Espeholt et al. 2018).
QNetwork = OneOf("auto", "mlp", "nature_cnn", "impala_cnn")


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

    network: QNetwork = "auto"  # Q-network: auto (Atari: nature_cnn, else mlp), mlp, nature_cnn or impala_cnn
    hidden: Widths = (256, 256)  # MLP Q-network hidden widths (units); Atari uses the network's CNN
    n_step: Count = 3  # steps of reward before the bootstrap (n-step targets)
    discount: Discount = 0.99  # γ per env step
    learning_rate: Positive = 1e-4  # Adam step size (per gradient step)
    adam_epsilon: Positive = 1.5e-4  # Adam ε, added to the root of the second-moment estimate
    batch_size: Count = 32  # transitions per gradient step
    samples_per_insert: Positive = 8.0  # transitions sampled per inserted one (batch × learner steps per env step)
    replay_size: Count = 1_000_000  # replay capacity (transitions = env steps); oldest removed first
    min_replay_size: Count = 20_000  # transitions in replay before the first gradient step
    target_update_period: Count = 2000  # learner steps between target-network copies
    publish_every: Count = 100  # learner steps between weights versions pushed to actors
    gradient_steps_per_call: Count = 8  # gradient steps per compiled learner call, each on a minibatch of its own
    epsilon_start: Fraction = 1.0  # actors' ε at env step 0
    epsilon_end: Fraction = 0.01  # actors' ε after the decay
    epsilon_decay_env_steps: Count0 = 250_000  # env steps (all actors) over which ε decays linearly
    epsilon_eval: Fraction = 0.001  # ε of the evaluation policy
    envs_per_actor: Count = 8  # envs each actor steps as one batch
    envs_per_item: Count0 = 0  # envs per replay item (0: largest divisor of envs_per_actor ≤ batch_size/4)
    eval_episodes: Count = 10  # episodes per evaluation
    eval_every_updates: Count = 20  # weights versions between evaluations
    prioritized: bool = False  # prioritized replay sampling (else uniform)
    priority_exponent: NonNegative = 0.6  # prioritized sampling exponent α (P(i) ∝ p_i^α, Schaul et al. 2016)
    importance_exponent: Fraction = 0.5  # β of prioritized replay's importance-sampling weights (0: none; 1: full)
    reward_clip: NonNegative = 0.0  # TD targets use rewards clipped to ±reward_clip (0: unclipped)
    double_q: bool = False  # bootstrap with Q_target(s', argmax Q_online(s')) (van Hasselt et al. 2016)
    lr_schedule: LrSchedule = "constant"  # constant, or linear: to lr_final_fraction × learning_rate at --total-steps
    lr_final_fraction: Fraction = 0.0  # linear schedule: the learning rate at the budget, as a fraction

    def __post_init__(self):
        if self.envs_per_item and self.envs_per_actor % self.envs_per_item:
            raise ValueError(
                f"envs_per_item = {self.envs_per_item} does not divide envs_per_actor = {self.envs_per_actor}: "
                "every replay item holds the same number of envs. Set envs_per_item to a divisor of "
                "envs_per_actor, or to 0 to let rlfleet choose, in --set or the --config-file."
            )
        if self.min_replay_size > self.replay_size:
            raise ValueError(
                f"min_replay_size = {self.min_replay_size} is above replay_size = {self.replay_size}: the "
                "replay would never hold enough items to start learning. Lower min_replay_size or raise "
                "replay_size in --set or the --config-file."
            )

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)


CNNS = ("nature_cnn", "impala_cnn")  # the `network` choices for Atari frames


def network_problem(network: str, frames: bool, env_id: str) -> str | None:
    """Why the `network` setting does not fit an env with (`frames`: Atari) or without stacked frames; None when
    it fits."""
    if network == "auto" or frames == (network in CNNS):
        return None
    fits = "nature_cnn or impala_cnn (Atari frames)" if frames else "mlp (vector observations)"
    return (
        f"setting network = {network!r} does not fit {env_id}: choose {fits}, or auto; fix it in --set or the "
        "--config-file."
    )


DQN_PRESETS = {"default": {}}
# Classic control (CartPole-v1, Acrobot-v1, MountainCar-v0): the RL Baselines3 Zoo's tuned DQN values for each
# env (network 256-256, learning rate, batch, replay size, target period, ε schedule, γ), with two changes
# that make the *last* network a good one more often, not just the best evaluation on the way: double-Q
# bootstrapping and a learning rate annealed to 0 at --total-steps (CartPole still oscillates between 500 and
# drops, so a run's final return varies: the docs' DQN page). The zoo's replay ratio is kept at or halved to
# 0.5 gradient steps per env step (a 2-core learner's limit): samples_per_insert = batch × 0.5. The targets
# here are 3-step.
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
ATARI = dict(reward_clip=1.0, eval_episodes=8, eval_every_updates=100)
DQN_ENV_OVERRIDES = {
    ("default", "CartPole-v1"): _CARTPOLE,
    ("default", "Acrobot-v1"): _ACROBOT,
    ("default", "MountainCar-v0"): _MOUNTAINCAR,
    ("default", "ALE/*"): ATARI,
}
