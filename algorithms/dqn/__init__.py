"""DQN (Mnih et al. 2015) with n-step targets and optional double-Q: discrete actions. A finished DQN run
directory (Q-network and replay checkpoint) can teach a QDagger student.

The folder holds all of it: `config` (settings and per-env presets), `items` (the replay item layout end to
end: a uniform or prioritized table with a SampleToInsertRatio rate limiter, its signature, the actor-side
ε-greedy writer, one writer per group of `envs_per_item` envs, and the learner-side decoding), `policy` (numpy
Q-values and ε-greedy), `networks` (MLP and Nature CNN Q-networks), `losses` (the pure-TF math) and `agent`
(`DQNAgent`).
"""

from __future__ import annotations

from rlfleet.algorithms import register
from rlfleet.algorithms.base import AlgorithmBuilder


class DQN(AlgorithmBuilder):
    """The DQN builder (module doc); QDagger's builder extends it."""

    name = "dqn"
    summary = "discrete actions; its runs can teach qdagger"
    action_space = "discrete"
    keeps_replay = True

    def config_class(self):
        from rlfleet.algorithms.dqn.config import DQNConfig

        return DQNConfig

    def presets(self):
        from rlfleet.algorithms.dqn.config import DQN_PRESETS

        return DQN_PRESETS

    def env_overrides(self):
        from rlfleet.algorithms.dqn.config import DQN_ENV_OVERRIDES

        return DQN_ENV_OVERRIDES

    def make_tables(self, spec, config, queue_items):
        from rlfleet.algorithms.dqn.items import dqn_tables_for

        return dqn_tables_for(spec, config, queue_items)

    def collect(self, actor, venv, weights, epoch):
        from rlfleet.algorithms.dqn.items import collect_transitions

        collect_transitions(actor, venv, weights, epoch)

    def make_agent(self, spec, config, seed, total_steps, teacher=None, teacher_replay=None):
        from rlfleet.algorithms.dqn.agent import DQNAgent

        return DQNAgent(spec, config, seed, total_steps)


register(DQN())
