"""QDagger (Agarwal et al. 2022, "Reincarnating Reinforcement Learning"): a DQN student that starts from
a finished DQN run (`--teacher`): offline distillation on the teacher's replay, then online DQN with a
decaying distillation coefficient. It shares DQN's replay table and actor-side writer.

Parts: `rlfleet.learner.presets.QDaggerConfig`, `rlfleet.learner.qdagger.QDaggerAgent`,
`rlfleet.learner.teacher.check_teacher_dir`.
"""

from rlfleet.algorithms import Algorithm, register

QDAGGER = register(
    Algorithm(
        name="qdagger",
        summary="a DQN student reincarnated from --teacher",
        action_space="discrete",
        config_class="rlfleet.learner.presets:QDaggerConfig",
        presets="rlfleet.learner.presets:QDAGGER_PRESETS",
        env_overrides="rlfleet.learner.presets:QDAGGER_ENV_OVERRIDES",
        tables="rlfleet.replay.server:dqn_tables_for",
        collect="rlfleet.actors.writers:collect_transitions",
        agent="rlfleet.learner.qdagger:make_agent",
        uses_teacher=True,
        check_teacher="rlfleet.learner.teacher:check_teacher_dir",
        keeps_replay=True,
        unused_settings=frozenset({"lr_schedule", "lr_final_fraction"}),
        unused_reason="its learning rate follows the distillation coefficient: learning_rate → learning_rate_final",
        # Before these settings: the teacher measured over eval_episodes, λ set from each evaluation alone.
        legacy_settings=dict(double_q=False, teacher_eval_episodes=0, distillation_score_episodes=0),
        status_values={
            "distillation_coefficient": ("distillation coefficient", "{:.3f}"),
            "teacher_eval_return_mean": ("teacher eval return", "{:,.1f}"),
            "random_eval_return_mean": ("random policy return", "{:,.1f}"),
            "distillation_score_return": ("student score (sets λ)", "{:,.1f}"),
        },
        progress_values={"distillation_coefficient": ("distillation", "{:.2f}")},
    )
)
