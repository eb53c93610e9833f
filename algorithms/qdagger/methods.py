"""The Reincarnating RL paper's alternatives to QDagger (Agarwal et al. 2022, Sec. 4 and App. A), each an algorithm
beside `qdagger` with the same teacher (`--teacher DIR`), student, replay, evaluation and budgets: a preset of the
QDagger student's settings (`rlfleet.algorithms.qdagger.config.QDaggerConfig`) that switches its terms on or off.

- `kickstarting` (Schmitt et al. 2018): distillation on the student's own data only, no offline phase
  (reincarnating_rl kickstarting_dqn: QDagger with no pretraining steps).
- `pretrain_finetune`: the offline phase trains TD + CQL on the teacher's replay (Kumar et al. 2020's
  regulariser, coefficient 1, reincarnating_rl pretrained_dqn), then plain DQN fine-tunes online at
  `learning_rate_final`; no distillation.
- `rehearsal`: `pretrain_finetune` whose online minibatches keep drawing on the teacher's replay, each transition
  the teacher's with probability 0.5 (`teacher_data_ratio`; reincarnating_rl's pretrained_dqn agent offers the
  ratio, its fine-tuning config sets 0; 0.5 is rlfleet's choice).
- `dqfd` (Hester et al. 2018): TD + a large-margin loss toward the teacher's greedy action (margin 1, coefficient
  1, reincarnating_rl dqfd_dqn with teacher actions), offline on the teacher's replay and online on the student's,
  the margin's weight decaying with the student's score as λ does in QDagger; no distillation.

Tabula rasa is `--algo dqn` with the student's settings (`benchmarks/reincarnation.py` runs it so).
"""

from __future__ import annotations

from rlfleet.algorithms import register
from rlfleet.algorithms.qdagger.builder import QDagger


class _Method(QDagger):
    """A QDagger student with `changes` on top of every QDagger preset and per-env override (`--set` still wins)."""

    changes: dict = {}

    def presets(self) -> dict[str, dict]:
        return {name: {**values, **self.changes} for name, values in super().presets().items()}

    def env_overrides(self) -> dict[tuple[str, str], dict]:
        return {key: {**values, **self.changes} for key, values in super().env_overrides().items()}


class Kickstarting(_Method):
    name = "kickstarting"
    summary = "reincarnation by distillation on the student's own data (no offline phase)"
    changes = {"offline_steps": 0}


class PretrainFinetune(_Method):
    name = "pretrain_finetune"
    summary = "offline TD + CQL on the teacher's replay, then DQN fine-tuning (no distillation)"
    changes = {"distillation_base": 0.0, "cql_coefficient": 1.0}


class Rehearsal(_Method):
    name = "rehearsal"
    summary = "pretrain_finetune with the teacher's data mixed into the online minibatches"
    changes = {"distillation_base": 0.0, "cql_coefficient": 1.0, "teacher_data_ratio": 0.5}


class DQfD(_Method):
    name = "dqfd"
    summary = "TD + a large margin toward the teacher's actions, offline then online (no distillation)"
    changes = {"distillation_base": 0.0, "margin_coefficient": 1.0, "margin": 1.0}


def register_all() -> None:
    """Registers every alternative (after `qdagger`, so that they are listed after it)."""
    for method in (Kickstarting(), PretrainFinetune(), Rehearsal(), DQfD()):
        register(method)
