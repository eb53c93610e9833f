"""DQN (Mnih et al. 2015) with n-step targets and optional double-Q: discrete actions. A finished DQN run
directory (Q-network and replay checkpoint) can teach a QDagger student.

The folder holds all of it: `config` (settings and per-env presets), `items` (the replay item layout end to
end: a uniform or prioritized table with a SampleToInsertRatio rate limiter, its signature, the actor-side
ε-greedy writer, one writer per group of `envs_per_item` envs, and the learner-side decoding), `policy` (numpy
Q-values and ε-greedy), `networks` (MLP and Nature CNN Q-networks), `losses` (the pure-TF math) and `agent`
(`DQNAgent`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlfleet.algorithms import register
from rlfleet.algorithms.base import AlgorithmBuilder, Behaviour, ReplaySource

if TYPE_CHECKING:
    from rlfleet.actors.adders import Adder
    from rlfleet.actors.writers import ActorContext, WeightsView
    from rlfleet.algorithms.base import Agent
    from rlfleet.algorithms.dqn.config import DQNConfig
    from rlfleet.envs.core import EnvSpec


class DQN(AlgorithmBuilder["DQNConfig"]):
    """The DQN builder (module doc); QDagger's builder extends it."""

    name = "dqn"
    summary = "discrete actions; its runs can teach qdagger"
    action_space = "discrete"
    keeps_replay = True

    def config_class(self) -> type[DQNConfig]:
        from rlfleet.algorithms.dqn.config import DQNConfig

        return DQNConfig

    def presets(self) -> dict[str, dict]:
        from rlfleet.algorithms.dqn.config import DQN_PRESETS

        return DQN_PRESETS

    def env_overrides(self) -> dict[tuple[str, str], dict]:
        from rlfleet.algorithms.dqn.config import DQN_ENV_OVERRIDES

        return DQN_ENV_OVERRIDES

    def check_config(self, config: DQNConfig, env_id: str) -> None:
        """Refuses a `network` that does not fit the env's observations (a CNN needs Atari frames)."""
        from rlfleet.algorithms.dqn.config import network_problem
        from rlfleet.envs.core import is_atari

        problem = network_problem(config.network, is_atari(env_id), env_id)
        if problem:
            raise ValueError(f"{self.name.upper()} {problem}")

    def make_tables(self, spec: EnvSpec, config: DQNConfig, queue_items: int | None) -> list:
        from rlfleet.algorithms.dqn.items import dqn_tables_for

        return dqn_tables_for(spec, config, queue_items)

    def behaviour(self, actor: ActorContext) -> Behaviour:
        from rlfleet.algorithms.dqn.items import behaviour

        return behaviour(actor)

    def adder(self, actor: ActorContext, weights: WeightsView, epoch: int) -> Adder:
        from rlfleet.algorithms.dqn.items import adder

        return adder(actor, weights, epoch)

    def make_agent(
        self, spec: EnvSpec, config: DQNConfig, seed: int, total_steps: int, sources: tuple[ReplaySource, ...] = ()
    ) -> Agent:
        from rlfleet.algorithms.dqn.agent import DQNAgent

        return DQNAgent(spec, config, seed, total_steps)


register(DQN())
