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

`--algo dqn`: `DQN("MlpPolicy", env)` with the settings of rlfleet's DQN preset for the env wherever SB3 has
them (`dqn_kwargs`; for the classic-control envs those are the RL Baselines3 Zoo's values): network widths,
learning rate (and its linear anneal), batch, replay size, warm-up, γ, n-step targets, ε schedule, and the
same gradient steps per env step, taken in the zoo's bursts (every 256 env steps); the target network is
copied after as many env steps as rlfleet's target period in gradient steps spans. Not matched: double-Q
(SB3's DQN has none) and Adam's ε (SB3's default).

Usage:
    python benchmarks/sb3_peer.py --env Hopper-v5 --seed 0 --total-steps 300000 --logdir runs/sb3-hopper-s0
    python benchmarks/sb3_peer.py --algo dqn --env CartPole-v1 --seed 0 --total-steps 100000 --logdir runs/sb3-dqn-s0
"""

from __future__ import annotations

import argparse
import json
import os
import time


def evaluate(model, env_id: str, episodes: int, seed: int) -> list[float]:
    """Undiscounted returns of `episodes` deterministic (mean-action) episodes, env seeds seed, seed+1, ...,
    run by the same episode loop as rlfleet's evaluation."""
    from rlfleet.learner.evaluation import run_episodes

    return run_episodes(env_id, episodes, seed, lambda o: model.predict(o[0], deterministic=True)[0])


DQN_BURST_ENV_STEPS = 256  # SB3 DQN trains every this many env steps (the zoo's CartPole-v1 train_freq)


def dqn_kwargs(env_id: str, total_steps: int) -> dict:
    """SB3 `DQN` arguments from rlfleet's `default` DQN preset for `env_id` (see the module doc), for a run of
    `total_steps` env steps."""
    from rlfleet.learner.presets import make_algo_config

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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--algo", choices=["ppo", "dqn"], default="ppo", help="SB3's PPO (defaults) or DQN (see above)")
    p.add_argument("--env", required=True, help="gymnasium id, e.g. Hopper-v5")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--total-steps", type=int, required=True, help="env steps")
    p.add_argument("--logdir", required=True)
    p.add_argument("--eval-every", type=int, default=50_000, help="env steps between evaluations")
    p.add_argument("--eval-episodes", type=int, default=10)
    args = p.parse_args()

    try:
        from stable_baselines3 import DQN, PPO
        from stable_baselines3.common.callbacks import BaseCallback
    except ImportError:
        raise SystemExit('the SB3 peer needs the bench extra: pip install -e ".[cpu,bench]"') from None
    import gymnasium as gym
    import numpy as np

    from rlfleet.actors.envs import quiet_settotalmass_warning

    quiet_settotalmass_warning()

    os.makedirs(args.logdir, exist_ok=True)
    metrics = open(os.path.join(args.logdir, "metrics.jsonl"), "w")
    clock = dict(eval=0.0, start=time.time())

    class Evaluations(BaseCallback):
        def __init__(self):
            super().__init__()
            self.next_eval = args.eval_every

        def _on_step(self) -> bool:
            if self.num_timesteps >= self.next_eval:
                self.next_eval += args.eval_every
                t0 = time.time()
                returns = evaluate(self.model, args.env, args.eval_episodes, 10_000 + args.seed)
                clock["eval"] += time.time() - t0
                metrics.write(
                    json.dumps(
                        dict(
                            env_steps=self.num_timesteps,
                            eval_return_mean=float(np.mean(returns)),
                            wall_seconds=time.time() - clock["start"] - clock["eval"],
                        )
                    )
                    + "\n"
                )
                metrics.flush()
            return True

    if args.algo == "ppo":
        model = PPO("MlpPolicy", gym.make(args.env), seed=args.seed, verbose=0)
        config = "stable-baselines3 PPO defaults (MlpPolicy)"
    else:
        kwargs = dqn_kwargs(args.env, args.total_steps)
        model = DQN("MlpPolicy", gym.make(args.env), seed=args.seed, verbose=0, **kwargs)
        config = "stable-baselines3 DQN (MlpPolicy) with rlfleet's DQN preset: " + ", ".join(
            f"{k}={'linear anneal' if callable(v) else v}" for k, v in kwargs.items()
        )
    model.learn(total_timesteps=args.total_steps, callback=Evaluations())
    train_seconds = time.time() - clock["start"] - clock["eval"]
    returns = evaluate(model, args.env, args.eval_episodes, 10_000 + args.seed)
    metrics.write(
        json.dumps(
            dict(env_steps=model.num_timesteps, eval_return_mean=float(np.mean(returns)), wall_seconds=train_seconds)
        )
        + "\n"
    )
    metrics.close()
    summary = dict(
        algo=f"sb3-{args.algo}",
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
    with open(os.path.join(args.logdir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(json.dumps({k: v for k, v in summary.items() if k != "final_eval_returns"}))


if __name__ == "__main__":
    main()
