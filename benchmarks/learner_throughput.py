"""How fast one learner reads replay and trains, with no actors: the number that decides how many actors one
learner can feed.

For each workload (`WORKLOADS`: an algorithm, an env, its preset) a real replay server process holds the
algorithm's real table (`serve_open_table`: the preset's signature and size, a `MinSize(1)` rate limiter so
that neither side blocks), pre-filled with real items written by the algorithm's own actor-side writer on the
real env (DQN: `rlfleet.actors.adders.WindowAdder` as DQN sets it up, ε = 1). Then, in this process, the learner's
own agent (`AlgorithmBuilder.make_agent`) and input path (`Agent.samples`):

(a) input alone: minibatches drawn through `Agent.samples` and thrown away;
(b) train step alone: `Agent.consume` on one resident minibatch;
(c) both: `Agent.consume` on each sample `Agent.samples` yields (K minibatches: `gradient_steps_per_call`), as
    the learner's training loop runs them
    (the input path's prefetching overlaps the two);
and the physical reference: the same minibatch gathered from numpy arrays in this process.

Each is reported per transition sampled and per gradient step: wall time, this process's CPU and the replay
server's CPU, and from them samples/s and gradient steps/s per learner core (learner and replay server CPU
together). Each workload runs three times in the same run (`VARIANTS`):
with one item per transition and one gradient step per learner call (`envs_per_item` 1,
`gradient_steps_per_call` 1: the cost structure of rlfleet's earlier layout and loop), with the preset's items
(G envs' transitions per item) and one step per call, and with the preset's items and steps per call, so each
change's gain is measured against a baseline on the same machine, in the same hour.

Usage:
    python benchmarks/learner_throughput.py [--workloads cartpole atari] [--seconds 5] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import types

import numpy as np

# name: (algo, env id, settings over the preset's, env steps written before timing)
WORKLOADS = {
    "cartpole": ("dqn", "CartPole-v1", {}, 20_000),
    "acrobot": ("dqn", "Acrobot-v1", {}, 20_000),
    "acrobot-8envs": ("dqn", "Acrobot-v1", {"envs_per_actor": 8}, 20_000),  # items of 8 envs
    "atari": ("dqn", "ALE/Pong-v5", {}, 8_000),
}


def cpu_seconds(process) -> float:
    """User + system CPU seconds of a `psutil.Process`."""
    t = process.cpu_times()
    return t.user + t.system


def timed(call, seconds: float, server) -> dict:
    """Runs `call` (no arguments) for `seconds` after 3 untimed calls; returns {"calls", "wall_ms", "cpu_ms",
    "server_cpu_ms"}: calls made, and per call wall, this process's CPU and the replay server's CPU
    (`server`: a `psutil.Process`, or None), in milliseconds."""
    for _ in range(3):
        call()
    calls, c0, s0, t0 = 0, time.process_time(), cpu_seconds(server) if server else 0.0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        call()
        calls += 1
    return dict(
        calls=calls,
        wall_ms=1e3 * (time.perf_counter() - t0) / calls,
        cpu_ms=1e3 * (time.process_time() - c0) / calls,
        server_cpu_ms=1e3 * (cpu_seconds(server) - s0) / calls if server else 0.0,
    )


# The layouts each workload is measured with: (envs_per_item, gradient_steps_per_call), 0 for the preset's.
VARIANTS = ((1, 1), (0, 1), (0, 0))


def workload_config(name: str, envs_per_item: int, steps_per_call: int = 0):
    """(algo, env id, spec, config) of workload `name` with `envs_per_item` and, unless 0,
    `gradient_steps_per_call` set."""
    from rlfleet.algorithms.settings import make_algo_config
    from rlfleet.envs.core import env_spec

    algo, env_id, overrides, _ = WORKLOADS[name]
    overrides = dict(overrides, envs_per_item=envs_per_item)
    if steps_per_call:
        overrides["gradient_steps_per_call"] = steps_per_call
    config = make_algo_config(algo, "default", env_id, overrides)
    return algo, env_id, env_spec(env_id), config


def open_tables(tables: list) -> list:
    """Copies of Reverb `tables` (names, signatures and sizes kept) with uniform sampling and a `MinSize(1)` rate
    limiter: Reverb's `SampleToInsertRatio` cannot be opened both ways (whatever its ratio, one side blocks once
    the other stops), and checking a rate limiter is a comparison, so what sampling costs is the same."""
    import reverb

    return [
        reverb.Table(
            name=t.info.name,
            sampler=reverb.selectors.Uniform(),
            remover=reverb.selectors.Fifo(),
            max_size=t.info.max_size,
            rate_limiter=reverb.rate_limiters.MinSize(1),
            signature=t.info.signature,
        )
        for t in tables
    ]


def serve_open_table(name: str, envs_per_item: int, port: int) -> None:
    """The replay server of `start_replay` (this script with --serve): `rlfleet.replay.server.serve` with the
    workload's tables, opened (`open_tables`)."""
    from rlfleet.common.parent import die_with_parent

    die_with_parent()
    from rlfleet.replay.server import serve, tables_for

    algo, _, spec, config = workload_config(name, envs_per_item)
    tables = open_tables(tables_for(algo, spec, config))
    serve(tables, port)


def start_replay(name: str, envs_per_item: int, port: int) -> subprocess.Popen:
    """Starts `serve_open_table` in a child process that gets SIGTERM if this one dies (`rlfleet.common.parent`)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", RLFLEET_PARENT_PID=str(os.getpid()))
    args = [os.path.abspath(__file__), "--serve", name, str(envs_per_item), str(port)]
    return subprocess.Popen([sys.executable, *args], env=env, stdout=subprocess.DEVNULL)


def stop(process: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 60 s; waits for it."""
    process.terminate()
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def wait_for_server(address: str, process: subprocess.Popen, timeout_s: float = 120) -> None:
    """Waits until the replay server at `address` answers (its start-up takes the same cores).

    Raises:
        RuntimeError: it exited or did not answer within `timeout_s`.
    """
    import reverb

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            reverb.Client(address).server_info(timeout=2)
            return
        except Exception:
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError(f"the replay server did not start on {address}") from None
            time.sleep(0.5)


class _StopAfter:
    """A batched env that sets `stop` once it has taken `steps` batch steps (the writer then returns)."""

    def __init__(self, venv, steps: int, stop: threading.Event):
        self.venv, self.left, self.stop = venv, steps, stop

    def reset(self, **kwargs):
        return self.venv.reset(**kwargs)

    def step(self, action):
        self.left -= 1
        if self.left <= 0:
            self.stop.set()
        return self.venv.step(action)


def fill(name: str, address: str, envs_per_item: int, server) -> dict:
    """Writes the workload's env steps into the table at `address` with the algorithm's own actor-side writer
    (an `Actor` without a learner: its collection loop alone, ε = 1); returns the writer's cost: {"env_steps",
    "cpu_ms", "server_cpu_ms"} per batch step of the actor's envs (env stepping and ε-greedy included)."""
    from rlfleet.actors import adders
    from rlfleet.actors.actor import Actor, Policy
    from rlfleet.algorithms import get as get_algorithm
    from rlfleet.envs.core import make_batched_env, resolve_backend
    from rlfleet.proto import rlfleet_pb2

    algo, env_id, spec, config = workload_config(name, envs_per_item)
    builder = get_algorithm(algo)
    agent = builder.make_agent(spec, config, 0, 0)
    b = config.envs_per_actor
    actor = Actor.__new__(Actor)
    actor.config = rlfleet_pb2.RunConfig(
        algo=algo,
        env_id=env_id,
        table=agent.table,
        num_envs=b,
        unroll_length=agent.unroll_length,
        envs_per_item=agent.envs_per_item,
        seed=0,
    )
    actor.replay_address, actor.frame_stack = address, spec.frame_stack
    actor.stop, actor.lock = threading.Event(), threading.Lock()
    actor.env_steps, actor.policy_version, actor.pending_returns, actor.pending_lengths = 0, -1, [], []
    actor.replay_epoch, actor._restarts = 0, 0
    weights = types.SimpleNamespace(
        latest=Policy(0, agent.export_weights(), rlfleet_pb2.Exploration(**dict(agent.exploration(), epsilon=1.0))),
        serial=0,
    )
    batch_steps = WORKLOADS[name][3] // b
    backend = resolve_backend(env_id, "auto")  # Atari: ale; else "auto", chosen by measurement on actors
    venv = make_batched_env(env_id, b, "sync" if backend == "auto" else backend)
    c0, s0 = time.process_time(), cpu_seconds(server)
    try:
        adders.collect(builder, actor, _StopAfter(venv, batch_steps, actor.stop), weights, 0)
    finally:
        venv.close()
    return dict(
        env_steps=actor.env_steps,
        cpu_ms=1e3 * (time.process_time() - c0) / batch_steps,
        server_cpu_ms=1e3 * (cpu_seconds(server) - s0) / batch_steps,
    )


def measure(name: str, envs_per_item: int, steps_per_call: int, seconds: float) -> dict:
    """Parts (a)-(c) and the numpy reference (module doc) for workload `name` with `envs_per_item` and
    `steps_per_call` (`workload_config`), per minibatch (= gradient step)."""
    import portpicker
    import psutil
    import tensorflow as tf

    from rlfleet.algorithms import get as get_algorithm

    algo, env_id, spec, config = workload_config(name, envs_per_item, steps_per_call)
    port = portpicker.pick_unused_port()
    address = f"127.0.0.1:{port}"
    replay = start_replay(name, envs_per_item, port)
    try:
        server = psutil.Process(replay.pid)
        wait_for_server(address, replay)
        out = dict(workload=name, algo=algo, env_id=env_id, batch_size=config.batch_size)
        out["actor_writer"] = fill(name, address, envs_per_item, server)
        agent = get_algorithm(algo).make_agent(spec, config, 0, 10**7)
        k = config.gradient_steps_per_call
        out.update(envs_per_item=agent.envs_per_item, gradient_steps_per_call=k)
        samples = agent.samples(address)
        out["input"] = timed(lambda: next(samples), seconds, server)
        batch = next(samples)
        out["train_step"] = timed(lambda: agent.consume(batch, 0, 10**6), seconds, None)
        out["both"] = timed(lambda: agent.consume(next(samples), 0, 10**6), seconds, server)
        samples.close()
    finally:
        stop(replay)
    for part in ("input", "train_step", "both"):  # per call of K minibatches -> per minibatch
        out[part].update({key: out[part][key] / k for key in ("wall_ms", "cpu_ms", "server_cpu_ms")})
    rng = np.random.default_rng(0)
    size = min(config.replay_size, 100_000)
    memory = {f: np.resize(v.numpy(), (size, *v.shape[2:])) for f, v in batch.items()}

    def gather():
        idx = rng.integers(0, size, config.batch_size)
        return {f: tf.constant(v[idx]) for f, v in memory.items()}

    out["numpy_gather"] = timed(gather, seconds, None)
    n = config.batch_size
    for part in ("input", "train_step", "both", "numpy_gather"):
        r = out[part]
        cpu = r["cpu_ms"] + r["server_cpu_ms"]  # learner + replay server CPU per minibatch
        r["cpu_us_per_transition"] = 1e3 * cpu / n
        r["samples_per_cpu_second"] = 1e3 * n / cpu
        r["gradient_steps_per_cpu_second"] = 1e3 / cpu
        r["gradient_steps_per_second"] = 1e3 / r["wall_ms"]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", nargs="+", default=["cartpole", "atari"], choices=sorted(WORKLOADS))
    p.add_argument("--seconds", type=float, default=5.0, help="seconds each part is timed")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument("--serve", nargs=3, default=None, help=argparse.SUPPRESS)  # the child of `start_replay`
    args = p.parse_args()
    if args.serve:
        serve_open_table(args.serve[0], int(args.serve[1]), int(args.serve[2]))
        return
    results = []
    for name in args.workloads:
        for envs_per_item, steps_per_call in VARIANTS:  # the baseline layout first, then the preset's
            r = measure(name, envs_per_item, steps_per_call, args.seconds)
            results.append(r)
            w = r["actor_writer"]
            print(
                f"{name} ({r['env_id']}), {r['envs_per_item']} env(s) per item, {r['gradient_steps_per_call']} "
                f"gradient step(s) per call, batch {r['batch_size']}: actor "
                f"batch step {w['cpu_ms']:.3f} ms CPU + {w['server_cpu_ms']:.3f} ms replay server",
                flush=True,
            )
            for part in ("input", "train_step", "both", "numpy_gather"):
                v = r[part]
                print(
                    f"  {part}: {v['wall_ms']:.3f} ms wall, {v['cpu_ms']:.3f} ms learner CPU + "
                    f"{v['server_cpu_ms']:.3f} ms replay server per minibatch; {v['cpu_us_per_transition']:.1f} µs "
                    f"CPU per transition; {v['samples_per_cpu_second']:,.0f} samples and "
                    f"{v['gradient_steps_per_cpu_second']:,.0f} minibatches per CPU second; "
                    f"{v['gradient_steps_per_second']:,.0f} per wall second",
                    flush=True,
                )
    if args.out:
        from rlfleet.common.files import atomic_write

        record = dict(machine=f"{os.cpu_count()} cores", seconds=args.seconds, results=results)
        atomic_write(args.out, json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
