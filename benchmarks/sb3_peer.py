"""The peer: Stable-Baselines3 PPO with its defaults, or SB3 DQN with rlfleet's DQN preset for the env, on the
same env, seed and env-step budget.

Writes a run directory shaped like rlfleet's (summary.json, metrics.jsonl) so that
`benchmarks/suite.py` reads both the same way. Needs the optional `bench` extra
(`pip install -e ".[cpu,bench]"`: stable-baselines3 and the CPU build of torch 2.13.0).

Protocol: `PPO("MlpPolicy", env, seed=seed)` with SB3's defaults (n_steps 2048, batch 64,
10 epochs, lr 3e-4, clip 0.2, GAE 0.95, γ 0.99, no observation or reward normalization);
an evaluation of `--eval-episodes` deterministic (mean-action) episodes every
`--eval-every` env steps and at the end. `wall_seconds` counts training only: the time
spent in evaluations is measured apart (`eval_seconds`), so the peer's wall-clock is
never inflated by our measuring.

`--normalize obs|reward|both` (with its defaults): SB3's own VecNormalize on its one env, its defaults (observations
normalised by their running mean and std, rewards divided by the running std of the discounted return with SB3's
default γ 0.99, both clipped to ±10), the rest SB3's PPO defaults; the evaluation normalises observations with the
training statistics at that time.

`--preset cleanrl`: SB3's PPO configured to rlfleet's `cleanrl` preset (CleanRL's `ppo_continuous_action.py`
details) wherever SB3 has the setting (`ppo_kwargs`): VecNormalize (observations and rewards, both clipped to ±10,
the return's γ), the same envs × steps per update, minibatch size and epochs, learning rate annealed linearly to 0,
clipped value loss, γ, GAE λ, PPO clip, gradient clip; SB3's own defaults already are CleanRL's for the rest
(orthogonal initialisation with the same gains, Adam ε 1e-5, one optimizer over the summed losses (its value
coefficient is set to half the preset's: SB3's value loss is the mean squared error, CleanRL's half of it),
advantages normalised per minibatch, tanh 64-64 networks, log-std starting at 0, actions clipped to the bounds).
Not matched: SB3 clips the value prediction and keeps that loss alone (CleanRL keeps the larger of the clipped and
unclipped losses); SB3 bootstraps at time limits as rlfleet does (CleanRL does not). Its evaluation normalises
observations with the training statistics at that time.

`--value-clip 0` (with `--preset cleanrl`): no clipped value loss (`clip_range_vf=None`), as the preset with
`--set value_clip=0`.

`--statistics rollout` (with `--preset cleanrl`): VecNormalize's statistics held fixed through each rollout and
merged with the rollout's raw observations and discounted returns at its end, before the update, as rlfleet's
learner updates its normalisers once per update (`RolloutStatisticsNormalize`); SB3's own (`step`) updates them at
every env step. The rollout's rewards are scaled by the statistics of its start (rlfleet's learner scales a batch's
with the statistics that include it).

`--algo dqn`: `DQN("MlpPolicy", env)` with the settings of rlfleet's DQN preset for the env wherever SB3 has
them (`dqn_kwargs`; for the classic-control envs those are the RL Baselines3 Zoo's values): network widths,
learning rate (and its linear anneal), batch, replay size, warm-up, γ, n-step targets, ε schedule, and the
same gradient steps per env step, taken in the zoo's bursts (every 256 env steps); the target network is
copied after as many env steps as rlfleet's target period in gradient steps spans. Not matched: double-Q
(SB3's DQN has none) and Adam's ε (SB3's default).

Usage:
    python benchmarks/sb3_peer.py --env Hopper-v5 --seed 0 --total-steps 300000 --logdir runs/sb3-hopper-s0
    python benchmarks/sb3_peer.py --preset cleanrl --env Hopper-v5 --seed 0 --total-steps 300000 --logdir runs/sb3c-s0
    python benchmarks/sb3_peer.py --algo dqn --env CartPole-v1 --seed 0 --total-steps 100000 --logdir runs/sb3-dqn-s0
"""

from __future__ import annotations

import argparse
import json
import os
import time


def evaluate(model, env_id: str, episodes: int, seed: int, normalizer=None) -> list[float]:
    """Undiscounted returns of `episodes` deterministic (mean-action) episodes, env seeds seed, seed+1, ...,
    run by the same episode loop as rlfleet's evaluation; `normalizer` (a VecNormalize) normalises the
    observations with its statistics, which the evaluation does not update."""
    from rlfleet.algorithms.library.evaluation import run_episodes

    prep = (lambda o: o) if normalizer is None else normalizer.normalize_obs
    return run_episodes(env_id, episodes, seed, lambda o: model.predict(prep(o), deterministic=True)[0]).returns


# SB3's PPO training diagnostics (its logger's keys) -> (rlfleet's metrics name, factor): rlfleet logs the entropy
# itself (SB3 its negative, the loss term) and the value loss as 0.5 × mean squared error (SB3: the mean squared error).
PPO_DIAGNOSTICS = {
    "train/approx_kl": ("approx_kl", 1.0),
    "train/clip_fraction": ("clip_fraction", 1.0),
    "train/entropy_loss": ("entropy", -1.0),
    "train/explained_variance": ("explained_variance", 1.0),
    "train/policy_gradient_loss": ("policy_loss", 1.0),
    "train/value_loss": ("value_loss", 0.5),
    "train/std": ("policy_std", 1.0),
    "train/learning_rate": ("learning_rate", 1.0),
}


def rollout_statistics_normalize(venv, **kwargs):
    """SB3's `VecNormalize` on `venv` whose observation and return statistics change only when `merge()` is called:
    through a rollout it normalises with the statistics of the rollout's start and keeps the raw observations
    (float [n_envs, obs_dim] per step, the reset's included) and each env's running discounted return (its own
    accumulator, γ and resets as VecNormalize's); `merge()` adds them to the statistics (the same parallel merge, so
    the statistics after it equal those VecNormalize reaches by updating at every step). `kwargs` are
    VecNormalize's."""
    import numpy as np
    from stable_baselines3.common.vec_env import VecNormalize

    class RolloutStatisticsNormalize(VecNormalize):
        def __init__(self, venv, **kwargs):
            super().__init__(venv, **kwargs)
            self.pending_obs, self.pending_returns = [], []

        def reset(self):
            obs = self.venv.reset()
            self.old_obs, self.returns = obs, np.zeros(self.num_envs)
            if self.training:
                self.pending_obs.append(np.array(obs))
            return self.normalize_obs(obs)

        def step_wait(self):
            obs, rewards, dones, infos = self.venv.step_wait()
            self.old_obs, self.old_reward = obs, rewards
            if self.training:
                self.pending_obs.append(np.array(obs))
                self.returns = self.returns * self.gamma + rewards
                self.pending_returns.append(self.returns.copy())
            for i in np.flatnonzero(dones):
                if "terminal_observation" in infos[i]:
                    infos[i]["terminal_observation"] = self.normalize_obs(infos[i]["terminal_observation"])
            self.returns[dones] = 0
            return self.normalize_obs(obs), self.normalize_reward(rewards), dones, infos

        def merge(self) -> None:
            """Adds the observations and returns kept since the last merge to the statistics."""
            if self.norm_obs and self.pending_obs:
                self.obs_rms.update(np.concatenate(self.pending_obs))
            if self.norm_reward and self.pending_returns:
                self.ret_rms.update(np.concatenate(self.pending_returns))
            self.pending_obs, self.pending_returns = [], []

    return RolloutStatisticsNormalize(venv, **kwargs)


DQN_BURST_ENV_STEPS = 256  # SB3 DQN trains every this many env steps (the zoo's CartPole-v1 train_freq)


def dqn_kwargs(env_id: str, total_steps: int) -> dict:
    """SB3 `DQN` arguments from rlfleet's `default` DQN preset for `env_id` (see the module doc), for a run of
    `total_steps` env steps."""
    from rlfleet.algorithms.settings import make_algo_config

    c = make_algo_config("dqn", "default", env_id, {})
    env_steps_per_gradient_step = c.batch_size / c.samples_per_insert
    lr = c.learning_rate
    if c.lr_schedule == "linear":  # SB3 passes the fraction of the budget still to go, 1 -> 0

        def lr(remaining: float, base=c.learning_rate, floor=c.lr_final_fraction) -> float:
            return base * (floor + (1.0 - floor) * remaining)

    return dict(
        learning_rate=lr,
        buffer_size=c.replay_size,
        learning_starts=c.min_replay_size,
        batch_size=c.batch_size,
        gamma=c.discount,
        n_steps=c.n_step,
        train_freq=DQN_BURST_ENV_STEPS,
        gradient_steps=max(1, round(DQN_BURST_ENV_STEPS / env_steps_per_gradient_step)),
        target_update_interval=max(1, round(c.target_update_period * env_steps_per_gradient_step)),
        exploration_initial_eps=c.epsilon_start,
        exploration_final_eps=c.epsilon_end,
        exploration_fraction=min(1.0, c.epsilon_decay_env_steps / total_steps),
        policy_kwargs=dict(net_arch=list(c.hidden)),
    )


def ppo_kwargs(env_id: str, n_envs: int = 0, overrides: dict | None = None) -> dict:
    """SB3 `PPO` arguments from rlfleet's `cleanrl` PPO preset for `env_id` (see the module doc), and the
    VecNormalize arguments and env count under "vec_normalize" and "n_envs". `n_envs` > 0 splits the same batch
    of env steps over that many envs (1: CleanRL's own layout, one env of 2048 steps). `overrides` (PPOConfig
    field -> value) change the preset as `--set` does.

    Raises:
        ValueError: `n_envs` does not divide the preset's batch.
    """
    from rlfleet.algorithms.settings import make_algo_config

    c = make_algo_config("ppo", "cleanrl", env_id, dict(overrides or {}))
    batch = c.envs_per_actor * c.unroll_length
    n_envs = n_envs or c.envs_per_actor
    if batch % n_envs:
        raise ValueError(f"--n-envs {n_envs} does not divide the cleanrl preset's batch of {batch} env steps")

    def lr(remaining: float, base=c.learning_rate, floor=c.lr_final_fraction) -> float:
        return base * (floor + (1.0 - floor) * remaining)  # SB3 passes the fraction of the budget still to go

    return dict(
        n_envs=n_envs,
        vec_normalize=dict(gamma=c.discount, clip_obs=c.obs_clip, clip_reward=c.reward_clip),
        n_steps=batch // n_envs,
        batch_size=batch // c.num_minibatches,
        n_epochs=c.epochs,
        learning_rate=lr,
        gamma=c.discount,
        gae_lambda=c.gae_lambda,
        clip_range=c.clip_epsilon,
        clip_range_vf=c.value_clip or None,  # SB3 takes None, not 0, for no clipping
        vf_coef=c.value_loss_coef / 2,  # SB3's value loss is the mean squared error, rlfleet's and CleanRL's half of it
        max_grad_norm=c.max_grad_norm,
        ent_coef=0.0,
        target_kl=c.target_kl or None,
        policy_kwargs=dict(net_arch=dict(pi=list(c.policy_hidden), vf=list(c.value_hidden))),
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--algo", choices=["ppo", "dqn"], default="ppo", help="SB3's PPO (defaults) or DQN (see above)")
    p.add_argument(
        "--preset",
        choices=["defaults", "cleanrl"],
        default="defaults",
        help="PPO: SB3's defaults, or configured to rlfleet's cleanrl preset (see above)",
    )
    p.add_argument(
        "--n-envs", type=int, default=0, help="--preset cleanrl: envs the batch is split over (0: the preset's)"
    )
    p.add_argument(
        "--normalize",
        choices=["none", "obs", "reward", "both"],
        default="none",
        help="PPO with its defaults: SB3's VecNormalize on the observations, the rewards or both (see above)",
    )
    p.add_argument(
        "--value-clip",
        type=float,
        default=None,
        help="--preset cleanrl: the value prediction's clip range (0: none; default: the preset's)",
    )
    p.add_argument(
        "--statistics",
        choices=["step", "rollout"],
        default="step",
        help="--preset cleanrl: VecNormalize's statistics updated at every env step (SB3's) or once per rollout "
        "(rlfleet's learner's; see above)",
    )
    p.add_argument("--env", required=True, help="gymnasium id, e.g. Hopper-v5")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--total-steps", type=int, required=True, help="env steps")
    p.add_argument("--logdir", required=True)
    p.add_argument("--eval-every", type=int, default=50_000, help="env steps between evaluations")
    p.add_argument("--eval-episodes", type=int, default=10)
    args = p.parse_args()
    if args.normalize != "none" and (args.algo != "ppo" or args.preset != "defaults"):
        p.error("--normalize goes with PPO's defaults (the cleanrl preset normalises both already; DQN has none)")
    if args.n_envs and (args.algo != "ppo" or args.preset != "cleanrl"):
        p.error("--n-envs goes with --preset cleanrl (SB3's defaults and DQN run one env)")
    if args.statistics != "step" and (args.algo != "ppo" or args.preset != "cleanrl"):
        p.error("--statistics goes with --preset cleanrl (the preset's VecNormalize)")
    if args.value_clip is not None and (args.algo != "ppo" or args.preset != "cleanrl" or args.value_clip < 0):
        p.error("--value-clip goes with --preset cleanrl and is >= 0 (0: no clipped value loss)")

    try:
        from stable_baselines3 import DQN, PPO
        from stable_baselines3.common.callbacks import BaseCallback
    except ImportError:
        raise SystemExit('the SB3 peer needs the bench extra: pip install -e ".[cpu,bench]"') from None
    import gymnasium as gym
    import numpy as np

    from rlfleet.common.files import atomic_write
    from rlfleet.envs.core import quiet_settotalmass_warning

    quiet_settotalmass_warning()

    os.makedirs(args.logdir, exist_ok=True)
    metrics = open(os.path.join(args.logdir, "metrics.jsonl"), "w")
    clock = dict(eval=0.0, start=time.monotonic())

    class Evaluations(BaseCallback):
        def __init__(self):
            super().__init__()
            self.next_eval = args.eval_every

        def _on_rollout_start(self) -> None:
            """One metrics row per PPO update, with its diagnostics under rlfleet's names (PPO_DIAGNOSTICS): SB3
            has logged them by the time the next rollout starts."""
            logged = self.model.logger.name_to_value
            if args.algo != "ppo" or "train/approx_kl" not in logged:
                return
            row = {name: factor * float(logged[k]) for k, (name, factor) in PPO_DIAGNOSTICS.items() if k in logged}
            metrics.write(json.dumps(dict(env_steps=self.num_timesteps, **row)) + "\n")

        def _on_rollout_end(self) -> None:
            if args.statistics == "rollout":  # the rollout is in the buffer, normalised; the update comes next
                normalizer.merge()

        def _on_training_end(self) -> None:
            self._on_rollout_start()  # the last update's diagnostics: no rollout starts after it

        def _on_step(self) -> bool:
            if self.num_timesteps >= self.next_eval:
                self.next_eval += args.eval_every
                t0 = time.monotonic()
                returns = evaluate(self.model, args.env, args.eval_episodes, 10_000 + args.seed, normalizer)
                clock["eval"] += time.monotonic() - t0
                metrics.write(
                    json.dumps(
                        dict(
                            env_steps=self.num_timesteps,
                            eval_return_mean=float(np.mean(returns)),
                            wall_seconds=time.monotonic() - clock["start"] - clock["eval"],
                        )
                    )
                    + "\n"
                )
                metrics.flush()
            return True

    normalizer = None
    if args.algo == "ppo" and args.preset == "cleanrl":
        from stable_baselines3.common.env_util import make_vec_env
        from stable_baselines3.common.vec_env import VecNormalize

        overrides = {} if args.value_clip is None else dict(value_clip=args.value_clip)
        kwargs = ppo_kwargs(args.env, args.n_envs, overrides)
        n_envs, vec_kwargs = kwargs.pop("n_envs"), kwargs.pop("vec_normalize")
        wrap = VecNormalize if args.statistics == "step" else rollout_statistics_normalize
        normalizer = wrap(make_vec_env(args.env, n_envs=n_envs, seed=args.seed), **vec_kwargs)
        model = PPO("MlpPolicy", normalizer, seed=args.seed, verbose=0, **kwargs)
        config = f"stable-baselines3 PPO configured to rlfleet's cleanrl preset: n_envs={n_envs}, " + ", ".join(
            f"{k}={'linear anneal' if callable(v) else v}" for k, v in {**vec_kwargs, **kwargs}.items()
        )
        config += f", VecNormalize statistics updated every {args.statistics}"
    elif args.algo == "ppo":
        env = gym.make(args.env)
        config = "stable-baselines3 PPO defaults (MlpPolicy)"
        if args.normalize != "none":  # the Monitor and DummyVecEnv PPO would wrap the env in, then VecNormalize
            from stable_baselines3.common.monitor import Monitor
            from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

            norm_obs, norm_reward = args.normalize in ("obs", "both"), args.normalize in ("reward", "both")
            env = normalizer = VecNormalize(
                DummyVecEnv([lambda: Monitor(env)]), norm_obs=norm_obs, norm_reward=norm_reward
            )
            config += f", VecNormalize(norm_obs={norm_obs}, norm_reward={norm_reward}) with its defaults"
        model = PPO("MlpPolicy", env, seed=args.seed, verbose=0)
    else:
        kwargs = dqn_kwargs(args.env, args.total_steps)
        model = DQN("MlpPolicy", gym.make(args.env), seed=args.seed, verbose=0, **kwargs)
        config = "stable-baselines3 DQN (MlpPolicy) with rlfleet's DQN preset: " + ", ".join(
            f"{k}={'linear anneal' if callable(v) else v}" for k, v in kwargs.items()
        )
    model.learn(total_timesteps=args.total_steps, callback=Evaluations())
    train_seconds = time.monotonic() - clock["start"] - clock["eval"]
    returns = evaluate(model, args.env, args.eval_episodes, 10_000 + args.seed, normalizer)
    metrics.write(
        json.dumps(
            dict(env_steps=model.num_timesteps, eval_return_mean=float(np.mean(returns)), wall_seconds=train_seconds)
        )
        + "\n"
    )
    metrics.close()
    summary = dict(
        algo=f"sb3-{args.algo}" + ("-cleanrl" if args.algo == "ppo" and args.preset == "cleanrl" else ""),
        env_id=args.env,
        seed=args.seed,
        completed=True,
        env_steps=int(model.num_timesteps),
        wall_seconds=train_seconds,
        eval_seconds=clock["eval"],
        final_eval_return_mean=float(np.mean(returns)),
        final_eval_episodes=len(returns),
        final_eval_returns=returns,
        config=config,
    )
    atomic_write(os.path.join(args.logdir, "summary.json"), json.dumps(summary, indent=2))
    print(json.dumps({k: v for k, v in summary.items() if k != "final_eval_returns"}))


if __name__ == "__main__":
    main()
