"""DQN (Mnih et al. 2015) with n-step targets and optional double-Q: discrete actions. A finished DQN run
directory (Q-network and replay checkpoint) can teach a QDagger student.

Parts: `rlfleet.learner.presets.DQNConfig`, `rlfleet.replay.server.dqn_tables_for` (a uniform or
prioritized table with a SampleToInsertRatio rate limiter), `rlfleet.actors.writers.collect_transitions`
(ε-greedy, one writer per env), `rlfleet.learner.dqn.DQNAgent`.
"""

from rlfleet.algorithms import Algorithm, register

DQN = register(
    Algorithm(
        name="dqn",
        summary="discrete actions; its runs can teach qdagger",
        action_space="discrete",
        config_class="rlfleet.learner.presets:DQNConfig",
        presets="rlfleet.learner.presets:DQN_PRESETS",
        env_overrides="rlfleet.learner.presets:DQN_ENV_OVERRIDES",
        tables="rlfleet.replay.server:dqn_tables_for",
        collect="rlfleet.actors.writers:collect_transitions",
        agent="rlfleet.learner.dqn:DQNAgent",
        keeps_replay=True,
        legacy_settings=dict(double_q=False, lr_schedule="constant", lr_final_fraction=0.0),
    )
)
