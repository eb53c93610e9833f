"""The Reincarnating RL paper's alternatives to QDagger (Agarwal et al. 2022, Sec. 4 and App. A), each an algorithm
beside `qdagger` with the same teacher (`--teacher DIR`), student, replay, evaluation and budgets: a preset of the
QDagger student's settings (`rlfleet.algorithms.qdagger.config.QDaggerConfig`) that switches its terms on or off.

- `kickstarting` (Schmitt et al. 2018): distillation on the student's own data only, no offline phase
  (reincarnating_rl kickstarting_dqn: QDagger with no pretraining steps); it starts from random weights, so its ε
  starts at 1 and decays over `epsilon_decay_env_steps` as a DQN's does.
- `pretrain_finetune`: the offline phase trains TD + CQL on the teacher's replay (Kumar et al. 2020's
  regulariser, coefficient 1, reincarnating_rl pretrained_dqn), then plain DQN fine-tunes online at
  `learning_rate_final`; no distillation.
- `rehearsal`: `pretrain_finetune` whose online minibatches keep drawing on the teacher's replay, each transition
  the teacher's with probability 0.5 (`teacher_data_ratio`; reincarnating_rl's pretrained_dqn agent offers the
  ratio, its fine-tuning config sets 0; 0.5 is rlfleet's choice).
- `dqfd` (Hester et al. 2018): TD + a large-margin loss toward the teacher's greedy action (margin 1, coefficient
  1, reincarnating_rl dqfd_dqn with teacher actions), offline on the teacher's replay and online on the student's,
  the margin's weight decaying with the student's score as λ does in QDagger; no distillation; the learning rate
  stays `learning_rate` online (reincarnating_rl's DQfD: no decay).
- `jsrl` (Uchendu et al. 2023, "Jump-Start Reinforcement Learning"): the teacher, as the guide policy, acts
  greedily on the actors for the first h steps of each episode, h drawn from 1..H per episode, and the student
  ε-greedily after; H starts at 100 (reincarnating_rl jsrl_dqn: `max_roll_in_steps`) and becomes int(0.8 · H)
  (its JSRLAgent's `decay_roll_in_steps`) once per `guide_roll_in_period_env_steps` online env steps (125k, one
  iteration of jsrl_dqn.gin's `Runner.training_steps`; 2,500 on CartPole and Acrobot, whose students run ~15k
  online steps: rlfleet's choice); the student learns by
  DQN's TD loss from all the data, from random weights (ε from 1), at `learning_rate` throughout; no offline
  phase, no distillation. reincarnating_rl's Atari config instead lets the student roll in and the teacher act
  after with a decaying probability (`roll_in_guide` False); rlfleet builds the paper's roll-in form.

Tabula rasa is `--algo dqn` with the student's settings (`benchmarks/reincarnation.py` runs it so).
"""

from __future__ import annotations

from rlfleet.algorithms import register
from rlfleet.algorithms.qdagger.builder import QDagger


class _Method(QDagger):
    """A QDagger student with `changes` on top of every QDagger preset and per-env override (`--set` still wins)."""

    changes: dict = {}

    def changed(self, values: dict) -> dict:
        """A preset's or per-env override's `values` with this method's changes."""
        return {**values, **self.changes}

    def presets(self) -> dict[str, dict]:
        return {name: self.changed(values) for name, values in super().presets().items()}

    def env_overrides(self) -> dict[tuple[str, str], dict]:
        return {key: self.changed(values) for key, values in super().env_overrides().items()}


class Kickstarting(_Method):
    """Kickstarting (module doc): QDagger without its offline phase, exploring from ε = 1."""

    name = "kickstarting"
    summary = "reincarnation by distillation on the student's own data (no offline phase)"
    changes = {"offline_steps": 0, "epsilon_start": 1.0}

    def check_config(self, config, env_id: str) -> None:
        """Refuses an offline phase (that would be QDagger)."""
        super().check_config(config, env_id)
        if config.offline_steps:
            raise ValueError(
                f"KICKSTARTING setting offline_steps = {config.offline_steps}: kickstarting has no offline phase "
                "(with one it is qdagger: --algo qdagger); remove it from --set, --offline-steps or the "
                "--config-file."
            )


class PretrainFinetune(_Method):
    """Pretraining + fine-tuning (module doc): offline TD + CQL on the teacher's replay, then DQN."""

    name = "pretrain_finetune"
    summary = "offline TD + CQL on the teacher's replay, then DQN fine-tuning (no distillation)"
    changes = {"distillation_base": 0.0, "cql_coefficient": 1.0}


class Rehearsal(_Method):
    """Rehearsal (module doc): pretraining + fine-tuning on minibatches that mix in the teacher's data."""

    name = "rehearsal"
    summary = "pretrain_finetune with the teacher's data mixed into the online minibatches"
    changes = {"distillation_base": 0.0, "cql_coefficient": 1.0, "teacher_data_ratio": 0.5}


class _HeldRate(_Method):
    """A method whose learning rate stays `learning_rate` online (`learning_rate_final` set to it)."""

    def changed(self, values: dict) -> dict:
        from rlfleet.algorithms.qdagger.config import QDaggerConfig

        rate = values.get("learning_rate", QDaggerConfig.learning_rate)
        return {**super().changed(values), "learning_rate_final": rate}


class DQfD(_HeldRate):
    """DQfD (module doc): TD + a large margin toward the teacher's greedy action, its weight decaying."""

    name = "dqfd"
    summary = "TD + a large margin toward the teacher's actions, offline then online (no distillation)"
    changes = {"distillation_base": 0.0, "margin_coefficient": 1.0, "margin": 1.0}
    status_values = {
        **QDagger.status_values,
        "margin_weight": ("large-margin weight", "{:.3f}"),
    }
    progress_values = {"margin_weight": ("margin", "{:.2f}")}


class JSRL(_HeldRate):
    """Jump-start RL (module doc): the teacher rolls in on the actors, the student learns by DQN from all of it."""

    name = "jsrl"
    summary = "the teacher acts the first steps of each episode, fewer as training goes on (no distillation)"
    changes = {"distillation_base": 0.0, "offline_steps": 0, "epsilon_start": 1.0, "guide_roll_in_steps": 100}
    status_values = {
        **QDagger.status_values,
        "guide_roll_in_steps": ("teacher roll-in (most steps)", "{:,.0f}"),
    }
    progress_values = {"guide_roll_in_steps": ("roll-in", "{:,.0f}")}


def register_all() -> None:
    """Registers every alternative (after `qdagger`, so that they are listed after it)."""
    for method in (Kickstarting(), PretrainFinetune(), Rehearsal(), DQfD(), JSRL()):
        register(method)
