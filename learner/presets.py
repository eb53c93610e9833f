"""BatchPPO hyperparameter presets.

`paper` holds the BatchPPO reference values (Hafner et al. 2017, reference
configs): Adam 1e-4, 25 epochs on the whole batch, an update every 30
episodes, KL target 0.01, advantage = discounted return − V (λ = 1), discount
0.995 (0.99 for HalfCheetah). `default` trades some of that for speed on a
small CPU machine: more, smaller gradient steps per update (minibatches), GAE
λ = 0.95 and Adam 3e-4, with the same KL-penalty objective.
"""
from __future__ import annotations

import dataclasses
import json


@dataclasses.dataclass
class PPOConfig:
    """All BatchPPO settings of a run.

    Units: `batch_env_steps` in env steps (0 = trigger by episodes only);
    `batch_episodes` in finished episodes (0 = trigger by steps only); an update
    starts when either trigger is reached. `max_policy_lag` in policy versions.
    """
    policy_hidden: tuple = (200, 100)
    value_hidden: tuple = (200, 100)
    init_std: float = 0.35
    mean_init_factor: float = 0.1
    learning_rate: float = 3e-4
    epochs: int = 10
    num_minibatches: int = 32
    batch_env_steps: int = 4096
    batch_episodes: int = 0
    discount: float = 0.99
    gae_lambda: float = 0.95
    kl_target: float = 0.01
    kl_cutoff_factor: float = 2.0
    kl_cutoff_coef: float = 1000.0
    init_beta: float = 1.0
    obs_clip: float = 5.0
    reward_clip: float = 10.0
    max_policy_lag: int = 2
    envs_per_actor: int = 8
    unroll_length: int = 64
    eval_episodes: int = 10
    eval_every_updates: int = 10

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "PPOConfig":
        d = json.loads(text)
        for k in ("policy_hidden", "value_hidden"):
            d[k] = tuple(d[k])
        return cls(**d)


PRESETS = {
    "default": {},
    "paper": dict(learning_rate=1e-4, epochs=25, num_minibatches=1, batch_env_steps=0,
                  batch_episodes=30, gae_lambda=1.0, discount=0.995, envs_per_actor=30,
                  unroll_length=100),
}

# Per-environment overrides applied on top of a preset (paper: discount 0.99 for HalfCheetah).
ENV_OVERRIDES = {
    ("paper", "HalfCheetah-v5"): dict(discount=0.99),
    ("default", "InvertedPendulum-v5"): dict(batch_env_steps=2048, eval_every_updates=5),
    ("default", "InvertedDoublePendulum-v5"): dict(batch_env_steps=2048),
}


def make_config(preset: str, env_id: str, overrides: dict | None = None) -> PPOConfig:
    """The preset's values, then the per-env overrides, then explicit `overrides`.

    Raises:
        ValueError: unknown preset, or an override key that is not a PPOConfig field.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown --config preset {preset!r}; choose one of {sorted(PRESETS)}.")
    values = {**PRESETS[preset], **ENV_OVERRIDES.get((preset, env_id), {}), **(overrides or {})}
    fields = {f.name for f in dataclasses.fields(PPOConfig)}
    bad = sorted(set(values) - fields)
    if bad:
        raise ValueError(f"unknown PPO setting(s) {bad}; valid settings: {sorted(fields)}.")
    return PPOConfig(**values)
