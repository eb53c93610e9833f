"""Where a DQN run on vector observations spends its CPU, per env step, part by part, in one run; beside each
distributed part, the single-process way (a replay buffer of numpy arrays in the learner's memory, as
Stable-Baselines3 keeps it) measured in the same run.

1. Actor loop: the preset's envs per actor (SyncVectorEnv) stepped with the ε-greedy numpy Q-network, with and
   without the Reverb writers in the layout of `rlfleet.actors.adders.WindowAdder` (an item of
   n + 1 steps of `envs_per_item` envs per batch step; see `actor_loop`), into a replay server process
   (`rlfleet.replay.server.serve`) with the table of `serve_open_table`: the preset's signature and size, a
   `MinSize(1)` rate limiter.
   Client CPU and the replay server's CPU per env step.
2. Replay sampling: minibatches of the preset's batch size from that table through
   `rlfleet.algorithms.dqn.items.batches` (the learner's own sampler: Reverb's tf.data dataset), from that table:
   wall, client CPU and server CPU per minibatch.
   Baseline: the same minibatch gathered from numpy arrays by uniform indices.
3. Learner update: the preset's `_train_step` graph (Huber TD loss, double-Q where the preset has it, Adam)
   per gradient step, and `consume` (the step and its bookkeeping), wall and CPU.
4. Evaluation: the learner's evaluation loop (`eval_episodes` envs stepped as one batch, ε-greedy numpy Q)
   per batch step, and per env step of training at the preset's schedule (one evaluation of full-length
   episodes every `eval_every_updates` x `publish_every` learner steps: an upper bound).

The sum is the CPU one env step of training costs at the preset's replay ratio
(`samples_per_insert` / `batch_size` gradient steps per env step); divided into the machine's cores it bounds
the env steps/s of the whole run.

Usage:
    python benchmarks/dqn_costs.py --env CartPole-v1 --seconds 5 [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np
from learner_throughput import open_tables, stop, timed, wait_for_server  # this script's folder is on sys.path

from rlfleet.algorithms.settings import make_algo_config
from rlfleet.envs.core import env_spec, make_batched_env


def preset(env_id: str, envs_per_item: int):
    """The DQN `default` preset's config for `env_id`, with `envs_per_item` set."""
    return make_algo_config("dqn", "default", env_id, {"envs_per_item": envs_per_item})


def serve_open_table(env_id: str, port: int, envs_per_item: int = 0) -> None:
    """The replay server of `start_replay` (this script with --serve): `rlfleet.replay.server.serve` with the
    preset's DQN table, opened (`learner_throughput.open_tables`: its signature and size, a `MinSize(1)` rate
    limiter)."""
    from rlfleet.common.parent import die_with_parent

    die_with_parent()
    from rlfleet.algorithms.dqn.items import dqn_tables_for
    from rlfleet.replay.server import serve

    serve(open_tables(dqn_tables_for(env_spec(env_id), preset(env_id, envs_per_item))), port)


def start_replay(env_id: str, port: int, envs_per_item: int = 0) -> subprocess.Popen:
    """Starts `serve_open_table` in a child process that gets SIGTERM if this one dies (`rlfleet.common.parent`)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", RLFLEET_PARENT_PID=str(os.getpid()))
    args = [os.path.abspath(__file__), "--env", env_id, "--serve", str(port), "--envs-per-item", str(envs_per_item)]
    return subprocess.Popen([sys.executable, *args], env=env, stdout=subprocess.DEVNULL)


def actor_loop(env_id: str, cfg, address: str | None, rng):
    """One batch step of the actor's loop as a function: env step on the ε-greedy action of a random Q-network,
    and with `address` the writers' appends and items in the layout of `WindowAdder` (one writer per
    `envs_per_item` envs, an item of n + 1 steps per writer and batch step), with its bound on items in flight.
    An approximation of that writer, a little cheaper: no finiteness checks or step counting."""
    import reverb

    from rlfleet.algorithms.dqn.items import TABLE as DQN_TABLE
    from rlfleet.algorithms.dqn.items import TRANSITION_ITEMS_IN_FLIGHT, envs_per_item
    from rlfleet.algorithms.dqn.networks import export_q, make_q_network
    from rlfleet.algorithms.dqn.policy import epsilon_greedy

    spec, b, n = env_spec(env_id), cfg.envs_per_actor, cfg.n_step
    g = envs_per_item(b, cfg.batch_size, cfg.envs_per_item)
    weights = export_q(make_q_network(spec, cfg, 0, "q"))
    venv = make_batched_env(env_id, b, "sync")
    state = dict(obs=venv.reset(seed=0)[0], t=0)
    client = reverb.Client(address) if address else None
    writers = [client.trajectory_writer(num_keep_alive_refs=n + 1) for _ in range(b // g)] if address else []

    def step():
        obs = state["obs"]
        action = np.asarray(epsilon_greedy(weights, obs, rng, 0.05), np.int32)
        state["obs"], reward, terminated, truncated, _ = venv.step(action)
        state["t"] += 1
        end = (terminated + 2 * (truncated & ~terminated)).astype(np.int8)
        for k, w in enumerate(writers):
            part = slice(k * g, (k + 1) * g)
            w.append(
                dict(
                    observation=obs[part].astype(np.float32),
                    action=action[part],
                    reward=reward[part].astype(np.float32),
                    end=end[part],
                    policy_version=np.int64(0),
                )
            )
            if state["t"] > n:
                w.create_item(DQN_TABLE, 1.0, {k: col[-(n + 1) :] for k, col in w.history.items()})
        for w in writers:
            w.flush(block_until_num_items=TRANSITION_ITEMS_IN_FLIGHT)

    def close():
        for w in writers:
            w.close()
        venv.close()

    return step, close


def costs(env_id: str, seconds: float, envs_per_item: int = 0) -> dict:
    """All four parts (module doc), in milliseconds; `per_env_step` sums them at the preset's schedule."""
    import portpicker
    import psutil
    import tensorflow as tf

    from rlfleet.algorithms.dqn.agent import DQNAgent
    from rlfleet.algorithms.dqn.items import batches
    from rlfleet.algorithms.dqn.policy import epsilon_greedy

    spec = env_spec(env_id)
    cfg = preset(env_id, envs_per_item)
    rng = np.random.default_rng(0)
    port = portpicker.pick_unused_port()
    replay = start_replay(env_id, port, envs_per_item)
    out = dict(env_id=env_id, envs_per_actor=cfg.envs_per_actor, batch_size=cfg.batch_size, envs_per_item=envs_per_item)
    try:
        server = psutil.Process(replay.pid)
        address = f"127.0.0.1:{port}"
        wait_for_server(address, replay)  # before timing anything: its start-up takes the same cores
        step, close = actor_loop(env_id, cfg, None, rng)
        out["actor_env_and_policy"] = timed(step, seconds, None)
        close()
        step, close = actor_loop(env_id, cfg, address, rng)
        out["actor_with_writes"] = timed(step, seconds, server)
        close()

        samples = batches(address, cfg.batch_size, cfg.n_step, spec.frame_stack)
        out["reverb_minibatch"] = timed(lambda: next(samples), seconds, server)
        stacked = next(samples)  # one minibatch, [1, N, ...] (what `consume` takes)
        batch = {k: v[0] for k, v in stacked.items()}  # [N, ...] (what `_train_step` takes)
        samples.close()  # its dataset's threads would go on fetching, counted in this process's CPU below
        # Baseline: the same minibatch out of numpy arrays in memory (a replay of the preset's size).
        memory = {k: np.resize(v.numpy(), (cfg.replay_size, *v.shape[1:])) for k, v in batch.items()}

        def gather():
            idx = rng.integers(0, cfg.replay_size, cfg.batch_size)
            return {k: tf.constant(v[idx]) for k, v in memory.items()}

        out["numpy_minibatch"] = timed(gather, seconds, None)
    finally:
        stop(replay)

    agent = DQNAgent(spec, cfg, total_steps=10**6)
    out["train_step"] = timed(lambda: agent._train_step(batch)[0].numpy(), seconds, None)
    out["consume"] = timed(lambda: agent.consume(stacked, 0, 1000), seconds, None)

    weights = agent.export_weights()
    venv = make_batched_env(env_id, cfg.eval_episodes, "sync")
    obs = [venv.reset(seed=0)[0]]

    def eval_step():
        obs[0] = venv.step(epsilon_greedy(weights, obs[0], rng, cfg.epsilon_eval))[0]

    out["eval_batch_step"] = timed(eval_step, seconds, None)
    venv.close()

    ratio = cfg.samples_per_insert / cfg.batch_size  # gradient steps per env step
    b = cfg.envs_per_actor
    eval_steps = spec.max_episode_steps or 1000  # batch steps of one evaluation of full-length episodes
    evals_per_env_step = ratio / (cfg.eval_every_updates * cfg.publish_every)
    a = out["actor_with_writes"]
    out["gradient_steps_per_env_step"] = ratio
    out["per_env_step_cpu_ms"] = per = dict(
        actor=a["cpu_ms"] / b,
        replay_server=(a["server_cpu_ms"] / b) + ratio * out["reverb_minibatch"]["server_cpu_ms"],
        learner_sampling=ratio * out["reverb_minibatch"]["cpu_ms"],
        learner_update=ratio * out["consume"]["cpu_ms"],
        evaluation=evals_per_env_step * eval_steps * out["eval_batch_step"]["cpu_ms"],
    )
    out["single_process_cpu_ms"] = single = dict(
        actor=out["actor_env_and_policy"]["cpu_ms"] / b,
        sampling=ratio * out["numpy_minibatch"]["cpu_ms"],
        learner_update=per["learner_update"],
        evaluation=per["evaluation"],
    )
    out["total_cpu_ms"] = sum(per.values())
    out["single_process_total_cpu_ms"] = sum(single.values())
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--seconds", type=float, default=5.0, help="seconds each part is timed")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument(
        "--envs-per-item",
        type=int,
        default=0,
        help="the envs_per_item setting (0: the preset's; 1: an item per transition)",
    )
    p.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)  # the child of `start_replay`
    args = p.parse_args()
    if args.serve:
        serve_open_table(args.env, args.serve, args.envs_per_item)
        return
    r = costs(args.env, args.seconds, args.envs_per_item)
    b = r["envs_per_actor"]
    for key, what in (
        ("actor_env_and_policy", f"actor batch step ({b} envs), env + ε-greedy Q"),
        ("actor_with_writes", "  the same with the Reverb writers"),
        ("reverb_minibatch", f"minibatch of {r['batch_size']} through Reverb"),
        ("numpy_minibatch", "  the same from numpy arrays in memory"),
        ("train_step", "learner gradient step (_train_step)"),
        ("consume", "  with its bookkeeping (consume)"),
        ("eval_batch_step", "evaluation batch step"),
    ):
        v = r[key]
        server = f", replay server CPU {v['server_cpu_ms']:.3f} ms" if v["server_cpu_ms"] else ""
        print(f"{what}: {v['wall_ms']:.3f} ms wall, {v['cpu_ms']:.3f} ms CPU{server}")
    ratio = r["gradient_steps_per_env_step"]
    print(f"CPU per env step at {ratio:g} gradient steps per env step (ms):")
    for k, v in r["per_env_step_cpu_ms"].items():
        print(f"  {k}: {v:.3f}")
    print(
        f"  total {r['total_cpu_ms']:.3f} ms ({1e3 / r['total_cpu_ms']:,.0f} env steps/s per core); single process "
        f"with a numpy replay: {r['single_process_total_cpu_ms']:.3f} ms "
        f"({1e3 / r['single_process_total_cpu_ms']:,.0f} env steps/s per core)"
    )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(r, f, indent=2)


if __name__ == "__main__":
    main()
