"""Collection throughput: env steps/s that actors write into Reverb, against the
raw stepping ceiling of the same env measured in the same run.

1. Ceiling: random actions, no policy, no replay, for each of: a plain
   single-env loop, gymnasium SyncVectorEnv xB, AsyncVectorEnv xB, and envpool
   xB (if installed). The fastest is the ceiling.
2. Collection: real `rlfleet replay`, `rlfleet learner` and `rlfleet actor`
   processes on loopback. The learner's batch is larger than the run
   (`batch_env_steps` 10^9) and actors run free of the lag credit
   (`actor_credit=false`), so it reads every item out of the queue and never
   trains: what is measured is collection only. Rate = items inserted into the replay table x
   (T x B) env steps per item, over a fixed window after warm-up.
3. Where the time goes, per batch step of B envs, measured in this process:
   the policy call (numpy MLP + sampling), the Reverb TrajectoryWriter append
   (+ item creation every T steps), and the env step of each backend.

Usage:
    python benchmarks/throughput.py --env HalfCheetah-v5 --num-envs 8 --seconds 30
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from rlfleet.algorithms.ppo.config import make_config  # noqa: E402
from rlfleet.algorithms.ppo.learning import BatchPPO  # noqa: E402
from rlfleet.algorithms.ppo.policy import sample_actions, to_env_action  # noqa: E402
from rlfleet.envs.core import BACKENDS, EnvError, env_spec, make_batched_env  # noqa: E402


def raw_steps_per_second(venv, seconds: float) -> float:
    """Env steps/s of a batched env with uniformly random actions drawn from numpy in one call per batch step
    (no policy, no replay), after a few untimed steps."""
    num_envs, space = venv.num_envs, venv.single_action_space
    rng = np.random.default_rng(0)
    venv.reset(seed=list(range(num_envs)))
    for _ in range(20):
        venv.step(rng.uniform(space.low, space.high, (num_envs, *space.shape)).astype(np.float32))
    steps, start = 0, time.monotonic()
    while time.monotonic() - start < seconds:
        venv.step(rng.uniform(space.low, space.high, (num_envs, *space.shape)).astype(np.float32))
        steps += num_envs
    return steps / (time.monotonic() - start)


def raw_rate(env_id: str, num_envs: int, backend: str, seconds: float) -> float:
    """Random-action env steps/s of a batched env (no policy, no replay)."""
    venv = make_batched_env(env_id, num_envs, backend)
    try:
        return raw_steps_per_second(venv, seconds)
    finally:
        venv.close()


def single_env_rate(env_id: str, seconds: float) -> float:
    """Env steps/s of one env stepped alone in this process with random actions (resets included)."""
    from rlfleet.envs.core import make_env

    env = make_env(env_id)
    try:
        env.reset(seed=0)
        env.action_space.seed(0)
        steps, start = 0, time.monotonic()
        while time.monotonic() - start < seconds:
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            steps += 1
            if terminated or truncated:
                env.reset()
        return steps / (time.monotonic() - start)
    finally:
        env.close()


def per_step_costs(env_id: str, num_envs: int, unroll: int) -> dict:
    """Microseconds per batch step for the policy call and the Reverb writes."""
    import reverb

    from rlfleet.algorithms.ppo.items import ppo_tables

    spec = env_spec(env_id)
    cfg = make_config("default", env_id)
    arrays = BatchPPO(spec, cfg).export_weights()
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((num_envs, *spec.obs_shape))
    low, high = np.asarray(spec.action_low, np.float32), np.asarray(spec.action_high, np.float32)
    n = 3000
    start = time.perf_counter()
    for _ in range(n):
        action, log_prob, mean, log_std = sample_actions(arrays, obs, rng)
        to_env_action(action, low, high)
    policy_us = (time.perf_counter() - start) / n * 1e6

    server = reverb.Server(ppo_tables(spec.obs_shape[0], spec.action_dim, num_envs, unroll, 10**6))
    client = reverb.Client(f"localhost:{server.port}")
    step = dict(
        observation=obs.astype(np.float32),
        action=action,
        reward=np.zeros(num_envs, np.float32),
        terminated=np.zeros(num_envs, bool),
        truncated=np.zeros(num_envs, bool),
        final_observation=np.zeros_like(obs, np.float32),
        discounted_return=np.zeros(num_envs, np.float32),
        behaviour_log_prob=log_prob,
        behaviour_mean=mean,
        behaviour_log_std=log_std,
        policy_version=np.zeros(num_envs, np.int64),
    )
    with client.trajectory_writer(num_keep_alive_refs=unroll + 1) as writer:
        start = time.perf_counter()
        for i in range(1, n + 1):
            writer.append(step)
            if i > unroll and (i - 1) % unroll == 0:
                writer.create_item("ppo_trajectories", 1.0, {k: c[-(unroll + 1) :] for k, c in writer.history.items()})
        writer.flush()
        writer_us = (time.perf_counter() - start) / n * 1e6
    server.stop()
    return dict(policy_call_us=policy_us, reverb_write_us=writer_us)


def collection_rate(env_id: str, num_envs: int, backend: str, num_actors: int, seconds: float, warmup: float) -> dict:
    """Env steps/s written into Reverb by real actor processes (the learner reads every item and never trains: it
    holds them, so keep the window to minutes), and the env backend each actor steps on."""
    from local_cluster import LocalCluster  # benchmarks/ (this script's folder is on sys.path)

    sets = ["--set", f"envs_per_actor={num_envs}", "--set", "batch_env_steps=1000000000", "--set", "actor_credit=false"]
    with LocalCluster(["--env", env_id, *sets]) as cluster:
        for _ in range(num_actors):
            cluster.add_actor("--env-backend", backend)
        cfg = make_config("default", env_id, {"envs_per_actor": num_envs})
        per_item = cfg.unroll_length * num_envs
        s0, s1, dt = cluster.window(seconds, warmup)
        inserts = s1["replay"][0]["inserts"] - s0["replay"][0]["inserts"]
        return dict(
            written_env_steps_per_second=inserts * per_item / dt,
            stepped_env_steps_per_second=(s1["env_steps"] - s0["env_steps"]) / dt,
            env_backends=[a.get("env_backend", "") for a in s1["actors"]],  # each actor's, `auto`'s choice included
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="HalfCheetah-v5")
    p.add_argument("--num-envs", type=int, default=8)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--backends", nargs="+", default=list(BACKENDS))
    p.add_argument("--actors", type=int, nargs="+", default=[1])
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args()
    cfg = make_config("default", args.env, {"envs_per_actor": args.num_envs})

    raw = {"single_env_loop": single_env_rate(args.env, args.seconds / 2)}
    for backend in args.backends:
        try:
            raw[f"{backend}_x{args.num_envs}"] = raw_rate(args.env, args.num_envs, backend, args.seconds / 2)
        except EnvError as e:
            print(f"skipping raw {backend}: {e}")
    ceiling_name = max(raw, key=raw.get)
    ceiling = raw[ceiling_name]
    print("raw stepping, random actions (env steps/s):")
    for k, v in raw.items():
        print(f"  {k:<22} {v:>10,.0f}")
    print(f"  ceiling: {ceiling_name} {ceiling:,.0f}")

    costs = per_step_costs(args.env, args.num_envs, cfg.unroll_length)
    print(
        f"per batch step of {args.num_envs} envs: policy call {costs['policy_call_us']:.0f} us, "
        f"Reverb append {costs['reverb_write_us']:.0f} us, raw env step (fastest backend) "
        f"{args.num_envs / ceiling * 1e6:.0f} us"
    )

    results = []
    for backend in args.backends:
        for k in args.actors:
            try:
                r = collection_rate(args.env, args.num_envs, backend, k, args.seconds, warmup=5)
            except Exception as e:  # noqa: BLE001 - report and continue with the next setting
                print(f"collection with {backend} x{k} actors failed: {e}")
                continue
            r.update(
                backend=backend,
                actors=k,
                num_envs=args.num_envs,
                fraction_of_ceiling=r["written_env_steps_per_second"] / ceiling,
            )
            results.append(r)
            print(
                f"collection {backend:<8} {k} actor(s) x {args.num_envs} envs: "
                f"{r['written_env_steps_per_second']:>8,.0f} env steps/s written to Reverb "
                f"({100 * r['fraction_of_ceiling']:.0f}% of ceiling; target >= 50%)",
                flush=True,
            )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                dict(
                    env=args.env,
                    raw=raw,
                    ceiling=ceiling,
                    ceiling_name=ceiling_name,
                    per_step_costs=costs,
                    collection=results,
                ),
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
