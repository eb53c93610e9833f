"""BatchPPO (Hafner et al. 2017) with PPO-clip as the default objective: continuous actions.

The folder holds all of it: `config` (settings, presets `default`, `paper` and `cleanrl`), `items` (the replay
item layout end to end: one FIFO queue of T+1-step batch items, its signature and the actor-side writer),
`policy` (the numpy Gaussian behaviour policy actors run), `networks` (policy and value MLPs), `losses` (the
pure-TF math), `learning` (`BatchPPO`: one update) and `agent` (`PPOAgent`: the learner side).
"""

from __future__ import annotations

from rlfleet.algorithms import register
from rlfleet.algorithms.base import AlgorithmBuilder


class PPO(AlgorithmBuilder):
    """The BatchPPO builder (module doc)."""

    name = "ppo"
    summary = "BatchPPO, continuous actions"
    action_space = "continuous"
    status_values = {
        "kl_beta": ("KL penalty β", "{:.3g}"),
        "off_policy_env_steps": ("env steps trained off-policy (since the learner started)", "{:,.0f}"),
    }

    def config_class(self):
        from rlfleet.algorithms.ppo.config import PPOConfig

        return PPOConfig

    def presets(self):
        from rlfleet.algorithms.ppo.config import PRESETS

        return PRESETS

    def env_overrides(self):
        from rlfleet.algorithms.ppo.config import ENV_OVERRIDES

        return ENV_OVERRIDES

    def make_tables(self, spec, config, queue_items):
        from rlfleet.algorithms.ppo.items import ppo_tables_for

        return ppo_tables_for(spec, config, queue_items)

    def collect(self, actor, venv, weights, epoch):
        from rlfleet.algorithms.ppo.items import collect_trajectories

        collect_trajectories(actor, venv, weights, epoch)

    def make_agent(self, spec, config, seed, total_steps, teacher=None, teacher_replay=None):
        from rlfleet.algorithms.ppo.agent import PPOAgent

        return PPOAgent(spec, config, seed, total_steps)


register(PPO())
