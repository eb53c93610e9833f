"""BatchPPO (Hafner et al. 2017) with PPO-clip as the default objective: continuous actions.

The folder holds all of it: `config` (settings, presets `default`, `paper` and `cleanrl`), `items` (the replay
item layout end to end: one FIFO queue of T+1-step batch items, its signature, the behaviour policy and adder),
`policy` (the numpy Gaussian behaviour policy actors run), `networks` (policy and value MLPs), `losses` (the
pure-TF math), `learning` (`BatchPPO`: one update) and `agent` (`PPOAgent`: the learner side).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlfleet.algorithms import register
from rlfleet.algorithms.base import AlgorithmBuilder, Behaviour, ReplaySource

if TYPE_CHECKING:
    from rlfleet.actors.adders import Adder
    from rlfleet.actors.writers import ActorContext, WeightsView
    from rlfleet.algorithms.base import Agent
    from rlfleet.algorithms.ppo.config import PPOConfig
    from rlfleet.envs.core import EnvSpec


class PPO(AlgorithmBuilder["PPOConfig"]):
    """The BatchPPO builder (module doc)."""

    name = "ppo"
    summary = "BatchPPO, continuous actions"
    action_space = "continuous"
    status_values = {
        "kl_beta": ("KL penalty β", "{:.3g}"),
        "off_policy_env_steps": ("env steps trained off-policy (since the learner started)", "{:,.0f}"),
    }

    def config_class(self) -> type[PPOConfig]:
        from rlfleet.algorithms.ppo.config import PPOConfig

        return PPOConfig

    def presets(self) -> dict[str, dict]:
        from rlfleet.algorithms.ppo.config import PRESETS

        return PRESETS

    def env_overrides(self) -> dict[tuple[str, str], dict]:
        from rlfleet.algorithms.ppo.config import ENV_OVERRIDES

        return ENV_OVERRIDES

    def make_tables(self, spec: EnvSpec, config: PPOConfig, queue_items: int | None) -> list:
        from rlfleet.algorithms.ppo.items import ppo_tables_for

        return ppo_tables_for(spec, config, queue_items)

    def behaviour(self, actor: ActorContext) -> Behaviour:
        from rlfleet.algorithms.ppo.items import behaviour

        return behaviour(actor)

    def adder(self, actor: ActorContext, weights: WeightsView, epoch: int) -> Adder:
        from rlfleet.algorithms.ppo.items import adder

        return adder(actor, weights, epoch)

    def make_agent(
        self, spec: EnvSpec, config: PPOConfig, seed: int, total_steps: int, sources: tuple[ReplaySource, ...] = ()
    ) -> Agent:
        from rlfleet.algorithms.ppo.agent import PPOAgent

        return PPOAgent(spec, config, seed, total_steps)


register(PPO())
