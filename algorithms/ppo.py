"""BatchPPO (Hafner et al. 2017) with PPO-clip as the default objective: continuous actions.

Parts: `rlfleet.learner.presets.PPOConfig` (settings, presets `default`, `paper` and `cleanrl`),
`rlfleet.replay.server.ppo_tables` (one FIFO queue of T+1-step batch items),
`rlfleet.actors.writers.collect_trajectories` (Gaussian behaviour policy, one writer per actor),
`rlfleet.learner.agents.PPOAgent` (the update and evaluation).
"""

from rlfleet.algorithms import Algorithm, register

PPO = register(
    Algorithm(
        name="ppo",
        summary="BatchPPO, continuous actions",
        action_space="continuous",
        config_class="rlfleet.learner.presets:PPOConfig",
        presets="rlfleet.learner.presets:PRESETS",
        env_overrides="rlfleet.learner.presets:ENV_OVERRIDES",
        tables="rlfleet.replay.server:ppo_tables_for",
        collect="rlfleet.actors.writers:collect_trajectories",
        agent="rlfleet.learner.agents:PPOAgent",
        status_values={
            "kl_beta": ("KL penalty β", "{:.3g}"),
            "off_policy_env_steps": ("env steps trained off-policy (since the learner started)", "{:,.0f}"),
        },
        # Runs started before a setting existed did what these values do.
        legacy_settings=dict(
            activation="relu",
            mean_head="tanh",
            policy_objective="kl_penalty",
            reward_scale="rms",
            max_grad_norm=0.0,
            obs_normalization=True,
            lr_schedule="constant",
            lr_final_fraction=0.0,
            synchronous=False,
            init="variance_scaling",
            adam_epsilon=1e-7,
            shared_optimizer=False,
            value_loss_coef=0.5,
            value_clip=0.0,
            advantage_norm="batch",
        ),
        resume_requires=dict(
            max_importance_weight="this PPO run was started by an rlfleet before issue 9 (time limits treated "
            "as terminal, no decoupled proximal objective)"
        ),
    )
)
