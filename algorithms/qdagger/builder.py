"""The QDagger builder (`QDagger`): DQN's tables and writer, its own settings and agent; the package registers it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlfleet.algorithms.base import ReplaySource
from rlfleet.algorithms.dqn import DQN

if TYPE_CHECKING:
    from rlfleet.algorithms.base import Agent
    from rlfleet.algorithms.qdagger.config import QDaggerConfig
    from rlfleet.algorithms.settings import RunSettings
    from rlfleet.envs.core import EnvSpec

TEACHER = "teacher"  # the name of its teacher's replay source (status: teacher/dqn_replay)


class QDagger(DQN):
    """The QDagger builder (module doc): DQN's tables and writer, its own settings and agent."""

    name = "qdagger"
    summary = "a DQN student reincarnated from --teacher"
    uses_teacher = True
    unused_settings = frozenset({"lr_schedule", "lr_final_fraction"})
    unused_reason = "its learning rate follows the distillation coefficient: learning_rate → learning_rate_final"
    status_values = {
        "distillation_coefficient": ("distillation coefficient", "{:.3f}"),
        "teacher_eval_return_mean": ("teacher eval return", "{:,.1f}"),
        "random_eval_return_mean": ("random policy return", "{:,.1f}"),
        "distillation_score_return": ("student score (sets λ)", "{:,.1f}"),
    }
    progress_values = {"distillation_coefficient": ("distillation", "{:.2f}")}

    def config_class(self) -> type[QDaggerConfig]:
        from rlfleet.algorithms.qdagger.config import QDaggerConfig

        return QDaggerConfig

    def presets(self) -> dict[str, dict]:
        from rlfleet.algorithms.qdagger.config import QDAGGER_PRESETS

        return QDAGGER_PRESETS

    def env_overrides(self) -> dict[tuple[str, str], dict]:
        from rlfleet.algorithms.qdagger.config import QDAGGER_ENV_OVERRIDES

        return QDAGGER_ENV_OVERRIDES

    def replay_sources(self, settings: RunSettings) -> list[ReplaySource]:
        # The teacher's replay, for the offline phase and the distillation loss on its data.
        return [ReplaySource(TEACHER, settings.teacher)] if settings.teacher else []

    def make_agent(
        self, spec: EnvSpec, config: QDaggerConfig, seed: int, total_steps: int, sources: tuple[ReplaySource, ...] = ()
    ) -> Agent:
        from rlfleet.algorithms.qdagger.agent import make_agent

        teacher = next((s for s in sources if s.name == TEACHER and s.run_dir and s.address), None)
        if teacher is None:
            raise ValueError(
                "QDagger needs its teacher's replay source: a DQN run directory and the host:port of its replay."
            )
        return make_agent(spec, config, seed, total_steps, teacher=teacher.run_dir, teacher_replay=teacher.address)

    def make_policy_agent(self, spec: EnvSpec, config: QDaggerConfig, seed: int) -> Agent:
        # The student acts as a DQN agent does: its Q-network, without the teacher it learned from.
        from rlfleet.algorithms.dqn.agent import DQNAgent

        return DQNAgent(spec, config, seed)

    def check_teacher(self, directory: str, spec: EnvSpec, config: QDaggerConfig | None = None) -> dict:
        from rlfleet.algorithms.qdagger.teacher import check_guide, check_items, check_teacher_dir

        run = check_teacher_dir(directory, spec)
        if config is not None:
            check_items(directory, run, spec, config)
            if config.guide_roll_in_steps:
                check_guide(directory, run)
        return run

    def import_teacher(self, model: str, env_id: str, out: str, **settings) -> dict:
        # A folder of a Q-network trained elsewhere and its data (`rlfleet.algorithms.qdagger.importing`); its
        # items' n_step defaults to this algorithm's for the env.
        from rlfleet.algorithms.qdagger.importing import ImportSettings, import_teacher

        return import_teacher(model, env_id, out, ImportSettings(**settings), algo=self.name)
