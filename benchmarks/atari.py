"""Atari speed and replay memory, measured in one run:

1. Ceiling: ale-py's C++ AtariVectorEnv xB stepping random actions (agent steps/s;
   one agent step = 4 frames), no policy, no replay.
2. Collection: real `rlfleet replay` (DQN table), `rlfleet learner` and `rlfleet actor`
   processes on loopback. The table's min_replay_size is set above what the run
   inserts, so the learner never samples (nothing competes with the actor for the
   cores) and the rate limiter never blocks inserts: the rate is agent steps written
   into Reverb per second (ε-greedy on the Nature CNN, per-env TrajectoryWriters).
3. Replay memory: bytes per transition in the replay server (resident memory growth
   / items) and on disk (size of a Reverb checkpoint / items), against the 28,224
   bytes of four stacked 84x84 frames per transition (56,448 with the next observation).
4. Learner: gradient steps/s of DQN (batch 32, Nature CNN, n-step 3) and of QDagger
   (the same plus the teacher's forward pass and the distillation term) on replay-shaped
   batches, in this process.
5. Where the learner's and the actor's time goes: the Nature CNN's forward pass (float32, and
   bfloat16) and its forward + backward pass alone (one `tf.function` call each) at the actor's
   batch (the envs per actor) and the learner's (32), in milliseconds; the actor's time per agent
   step against what 60% of the raw rate leaves beside the env step; and the ceiling the CPU's
   arithmetic puts on the learner: the GFLOP of one DQN step against the machine's
   float32 matmul rate (GFLOP/s), measured in the same run.

6. With --policy-loop B [B ...]: the actor's ceiling without replay, the env and the behaviour policy alone:
   AtariVectorEnv xB stepped with the argmax of the Nature CNN's forward pass (one `tf.function` call per
   batch), one batch at a time, and with AtariVectorEnv's asynchronous batches (2B envs, B per call: one
   half steps in ale-py's threads while the network runs on the other); agent steps/s against the raw
   rate of the same B, measured in the same run.

Usage:
    python benchmarks/atari.py --env ALE/Pong-v5 --num-envs 8 --seconds 30
    python benchmarks/atari.py --env ALE/Pong-v5 --seconds 30 --policy-loop 8 32 64
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import numpy as np

from rlfleet.algorithms.settings import make_algo_config  # noqa: E402
from rlfleet.envs.core import env_spec, make_atari_env  # noqa: E402

STACKED_BYTES = 4 * 84 * 84


def raw_rate(env_id: str, num_envs: int, seconds: float) -> float:
    """Random-action agent steps/s of AtariVectorEnv xB."""
    venv = make_atari_env(env_id, num_envs)
    try:
        venv.reset(seed=list(range(num_envs)))
        n = venv.single_action_space.n
        rng = np.random.default_rng(0)
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            venv.step(rng.integers(0, n, num_envs))
            steps += num_envs
        return steps / (time.perf_counter() - start)
    finally:
        venv.close()


def _dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def collection(env_id: str, num_envs: int, seconds: float, warmup: float) -> dict:
    """Agent steps/s written to Reverb by one real actor process, and replay bytes per transition."""
    import psutil
    from local_cluster import LocalCluster  # benchmarks/ (this script's folder is on sys.path)

    from rlfleet.deploy.status import get_status
    from rlfleet.replay.checkpoints import checkpoint_replay

    sets = ["--set", f"envs_per_actor={num_envs}", "--set", "min_replay_size=900000", "--set", "replay_size=1000000"]
    checkpoints = tempfile.mkdtemp(prefix="rlfleet-atari-replay-")
    with LocalCluster(["--algo", "dqn", "--env", env_id, *sets], ["--checkpoint-dir", checkpoints]) as cluster:
        address = cluster.learner_address
        replay_proc = psutil.Process(cluster.procs[0].pid)
        rss0 = replay_proc.memory_info().rss
        actor = cluster.add_actor()
        s0, s1, dt = cluster.window(seconds, warmup)
        actor.terminate()
        actor.wait(30)
        items = get_status(address, 2)["replay"][0]["size"]
        rss1 = replay_proc.memory_info().rss
        path = checkpoint_replay(cluster.replay_address, root=checkpoints)  # RUN/replay/ckpt-N
        inserts = s1["replay"][0]["inserts"] - s0["replay"][0]["inserts"]
        return dict(
            written_agent_steps_per_second=inserts / dt,
            items=items,
            memory_bytes_per_transition=(rss1 - rss0) / items,
            checkpoint_bytes_per_transition=_dir_bytes(path) / items,
        )


def _calls_per_second(call, seconds: float) -> float:
    """Calls per second of `call` (no arguments; it returns when its work is done) over `seconds`, after 3 calls
    that are not timed (tracing, first allocations)."""
    for _ in range(3):
        call()
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        call()
        count += 1
    return count / (time.perf_counter() - start)


def learner_rates(env_id: str, seconds: float) -> dict:
    """Gradient steps/s of DQN and QDagger (batch 32, Nature CNN) on replay-shaped random batches."""
    import tensorflow as tf

    from rlfleet.algorithms.dqn.agent import DQNAgent
    from rlfleet.algorithms.dqn.networks import make_q_network
    from rlfleet.algorithms.qdagger.agent import QDaggerAgent
    from rlfleet.algorithms.qdagger.teacher import Teacher

    spec = env_spec(env_id)
    rng = np.random.default_rng(0)
    out = {}
    for algo in ("dqn", "qdagger"):
        cfg = make_algo_config(algo, "default", env_id)
        n, b = cfg.n_step, cfg.batch_size
        frames = lambda b=b: tf.constant(rng.integers(0, 255, (b, 4, 84, 84), dtype=np.uint8))
        batch = {  # a minibatch as the learner's input path gives it (`rlfleet.algorithms.dqn.items.transitions`)
            "observation": frames(),
            "next_observation": frames(),
            "action": tf.constant(rng.integers(0, spec.action_dim, b, dtype=np.int32)),
            "reward": tf.constant(rng.choice([-1.0, 0.0, 1.0], (b, n)).astype(np.float32)),
            "done": tf.zeros((b, n), tf.float32),
            "valid": tf.ones(b, tf.float32),
            "policy_version": tf.zeros(b, tf.int64),
        }
        if algo == "dqn":
            agent = DQNAgent(spec, cfg)
            step = agent._train_step
        else:
            teacher = Teacher("-", make_q_network(spec, cfg, 7, "teacher_q"), "-", None)
            agent = QDaggerAgent(spec, cfg, 0, teacher, "-")
            step = agent._qdagger_step
        out[algo] = _calls_per_second(lambda step=step, batch=batch: step(batch)[0].numpy(), seconds)
    return out


def network_costs(batches=(8, 32), seconds: float = 5.0) -> dict:
    """Milliseconds per call of the Nature CNN (4 stacked 84x84 frames, 6 actions): forward, forward with bfloat16
    weights and arithmetic (`rlfleet.algorithms.dqn.policy.nature_cnn_q` on the weights cast once), and forward +
    backward (the gradient of the summed Q-values), at each batch size, each a `tf.function`."""
    import tensorflow as tf

    from rlfleet.algorithms.dqn.networks import CNN
    from rlfleet.algorithms.dqn.policy import nature_cnn_q

    net = CNN("nature_cnn", 4, (84, 84), 6, 0, "q")
    rng = np.random.default_rng(0)
    weights = (net.conv_kernels, net.conv_biases, net.kernels, net.biases)
    bf16 = [[tf.cast(v, tf.bfloat16) for v in vs] for vs in weights]

    @tf.function
    def forward(frames):
        return net(frames)

    @tf.function
    def forward_bfloat16(frames):
        return nature_cnn_q(frames, *bf16)

    @tf.function
    def forward_backward(frames):
        with tf.GradientTape() as tape:
            total = tf.reduce_sum(net(frames))
        grads = tape.gradient(total, net.trainable_variables)
        return tf.add_n([tf.reduce_sum(g) for g in grads])  # every gradient is computed

    def ms(fn, x) -> float:
        return 1000 / _calls_per_second(lambda: fn(x).numpy(), seconds)

    out = {}
    for b in batches:
        x = tf.constant(rng.integers(0, 255, (b, 4, 84, 84), dtype=np.uint8))
        out[b] = {
            "forward_ms": ms(forward, x),
            "forward_bfloat16_ms": ms(forward_bfloat16, x),
            "forward_backward_ms": ms(forward_backward, x),
        }
    return out


def actor_budget(raw: float, written: float, forward: dict, num_envs: int, share: float = 0.6) -> dict:
    """The actor's time per agent step against what `share` of the raw env rate allows, in microseconds of wall
    time on the whole machine (each part measured alone, using every core it can):
    `env_us` (1 / raw rate), `allowed_us` (1 / (share x raw rate)), `left_us` (what that leaves beside the env
    step for the behaviour policy and the replay writes), `forward_us` / `forward_bfloat16_us` (the Nature CNN's
    forward pass per observation at a batch of `num_envs`, from `network_costs`) and `actor_us` (1 / the rate one
    actor writes into Reverb). `share` is the fraction of the raw rate an actor is to reach (0.6)."""
    env_us, allowed_us = 1e6 / raw, 1e6 / (share * raw)
    return dict(
        share=share,
        env_us=env_us,
        allowed_us=allowed_us,
        left_us=allowed_us - env_us,
        forward_us=1e3 * forward["forward_ms"] / num_envs,
        forward_bfloat16_us=1e3 * forward["forward_bfloat16_ms"] / num_envs,
        actor_us=1e6 / written,
    )


def nature_cnn_flops(net, frame_shape=(84, 84)) -> dict:
    """Floating-point operations per sample (a multiply-add counts 2) of `net` (a Nature `CNN`): "forward", and
    "forward_backward", the forward pass plus the gradients of every weight and of every layer's input but the
    first (the frames need none): 3x the forward's, less the first convolution's once. Biases and ReLUs (under 1%)
    are left out."""
    from rlfleet.algorithms.dqn.policy import CONV_STRIDES

    (h, w), layers = frame_shape, []
    for kernel, stride in zip(net.conv_kernels, CONV_STRIDES):
        k, _, c_in, c_out = kernel.shape
        h, w = (h - k) // stride + 1, (w - k) // stride + 1
        layers.append(2 * h * w * c_out * k * k * c_in)
    layers += [2 * kernel.shape[0] * kernel.shape[1] for kernel in net.kernels]
    forward = sum(layers)
    return {"forward": forward, "forward_backward": 3 * forward - layers[0]}


def matmul_gflops(seconds: float, n: int = 2048) -> dict:
    """The CPU's sustained arithmetic rate, GFLOP/s, on an n x n matmul (one `tf.function` call each, all threads),
    in float32 and in bfloat16: the ceiling any network's arithmetic reaches on this machine."""
    import tensorflow as tf

    out = {}
    for dtype in (tf.float32, tf.bfloat16):
        a = tf.cast(tf.random.stateless_uniform((n, n), (0, 1)), dtype)
        mm = tf.function(lambda x: tf.reduce_sum(tf.cast(tf.matmul(x, x), tf.float32)))
        out[dtype.name] = 2 * n**3 * _calls_per_second(lambda mm=mm, a=a: mm(a).numpy(), seconds) / 1e9
    return out


def arithmetic_ceiling(env_id: str, dqn_steps_per_second: float, seconds: float) -> dict:
    """What the CPU's arithmetic allows the DQN learner of `env_id` (its preset's batch, the Nature CNN on 4
    stacked 84x84 frames, the env's actions), as `learner_rates` measures it: the GFLOP of one
    gradient step (the online network's forward + backward and the target network's forward, `nature_cnn_flops`),
    the GFLOP/s the learner computes at `dqn_steps_per_second`, the float32 matmul peak (`matmul_gflops`), and
    the steps/s at that peak: an upper bound for any float32 learner on this machine, and its ratio to today's."""
    from rlfleet.algorithms.dqn.networks import CNN

    batch_size = make_algo_config("dqn", "default", env_id).batch_size
    flops = nature_cnn_flops(CNN("nature_cnn", 4, (84, 84), env_spec(env_id).action_dim, 0, "q"))
    per_step = batch_size * (flops["forward_backward"] + flops["forward"]) / 1e9
    peak = matmul_gflops(seconds)
    return dict(
        batch_size=batch_size,
        gflop_per_step=per_step,
        learner_gflops=per_step * dqn_steps_per_second,
        matmul_gflops=peak,
        max_steps_per_second=peak["float32"] / per_step,
        max_speedup=peak["float32"] / per_step / dqn_steps_per_second,
    )


def policy_loop_rates(env_id: str, batches, seconds: float) -> dict:
    """{B: {"raw", "sync", "async_"}}: agent steps/s of AtariVectorEnv xB with random actions (`raw_rate`), with
    the Nature CNN's argmax one batch at a time (sync), and with asynchronous batches of B out of 2B envs."""
    import tensorflow as tf

    from rlfleet.algorithms.dqn.networks import CNN

    net = CNN("nature_cnn", 4, (84, 84), env_spec(env_id).action_dim, 0, "q")
    forward = tf.function(lambda frames: tf.argmax(net(frames), axis=1))

    def rate(num_envs: int, batch: int) -> float:
        asynchronous = batch < num_envs
        venv = make_atari_env(env_id, num_envs, batch_size=batch if asynchronous else 0)
        try:
            obs, _ = venv.reset(seed=0)  # asynchronous: the first `batch` envs' observations
            steps, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                actions = forward(tf.constant(obs)).numpy()
                if asynchronous:
                    venv.send(actions)
                    obs = venv.recv()[0]
                else:
                    obs = venv.step(actions)[0]
                steps += len(obs)
            return steps / (time.perf_counter() - start)
        finally:
            venv.close()

    forward(tf.constant(np.zeros((1, 4, 84, 84), np.uint8)))
    return {b: dict(raw=raw_rate(env_id, b, seconds), sync=rate(b, b), async_=rate(2 * b, b)) for b in batches}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="ALE/Pong-v5")
    p.add_argument("--num-envs", type=int, default=8)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument(
        "--policy-loop",
        type=int,
        nargs="+",
        default=None,
        metavar="B",
        help="only item 6: the env and the policy's forward pass, without replay, at these envs per actor",
    )
    args = p.parse_args()
    if args.policy_loop:
        loops = policy_loop_rates(args.env, args.policy_loop, args.seconds / 3)
        for b, r in loops.items():
            print(
                f"AtariVectorEnv x{b}: raw {r['raw']:,.0f} agent steps/s; with the Nature CNN one batch at a time "
                f"{r['sync']:,.0f} ({100 * r['sync'] / r['raw']:.0f}% of raw); asynchronous batches of {b} of "
                f"{2 * b} envs {r['async_']:,.0f} ({100 * r['async_'] / r['raw']:.0f}%)",
                flush=True,
            )
        if args.out:
            with open(args.out, "w") as f:
                json.dump(dict(env=args.env, policy_loop=loops), f, indent=2)
        return
    raw = raw_rate(args.env, args.num_envs, args.seconds / 2)
    print(
        f"raw AtariVectorEnv x{args.num_envs}, random actions: {raw:,.0f} agent steps/s ({4 * raw:,.0f} frames/s)",
        flush=True,
    )
    grads = learner_rates(args.env, args.seconds / 2)
    print(
        f"learner, batch 32, Nature CNN: DQN {grads['dqn']:.1f} gradient steps/s, "
        f"QDagger {grads['qdagger']:.1f} gradient steps/s (at 1 step per 4 agent steps: "
        f"{4 * grads['dqn']:.0f} agent steps/s)",
        flush=True,
    )
    costs = network_costs((args.num_envs, 32), args.seconds / 6)
    for b, c in costs.items():
        print(
            f"Nature CNN, batch {b}: forward {c['forward_ms']:.2f} ms ({c['forward_bfloat16_ms']:.2f} in bfloat16), "
            f"forward + backward "
            f"{c['forward_backward_ms']:.2f} ms",
            flush=True,
        )
    ceiling = arithmetic_ceiling(args.env, grads["dqn"], args.seconds / 6)
    print(
        f"DQN step (batch {ceiling['batch_size']}: online forward + backward, target forward): "
        f"{ceiling['gflop_per_step']:.2f} GFLOP; at "
        f"{grads['dqn']:.1f} steps/s the learner computes {ceiling['learner_gflops']:.0f} GFLOP/s; this CPU's matmul "
        f"peak is {ceiling['matmul_gflops']['float32']:.0f} GFLOP/s in float32 "
        f"({ceiling['matmul_gflops']['bfloat16']:.0f} in bfloat16), which caps the step at "
        f"{ceiling['max_steps_per_second']:.0f} steps/s ({ceiling['max_speedup']:.2f}x today's)",
        flush=True,
    )
    col = collection(args.env, args.num_envs, args.seconds, warmup=10)
    print(
        f"collection, 1 actor x {args.num_envs} envs: {col['written_agent_steps_per_second']:,.0f} agent steps/s "
        f"written to Reverb ({100 * col['written_agent_steps_per_second'] / raw:.0f}% of the raw rate)"
    )
    print(
        f"replay: {col['items']:,} transitions; {col['memory_bytes_per_transition']:,.0f} bytes each in server "
        f"memory, {col['checkpoint_bytes_per_transition']:,.0f} on disk (four stacked frames: {STACKED_BYTES:,})"
    )
    budget = actor_budget(raw, col["written_agent_steps_per_second"], costs[args.num_envs], args.num_envs)
    print(
        f"actor budget per agent step: {100 * budget['share']:.0f}% of the raw rate allows {budget['allowed_us']:.0f} "
        f"us, the env step takes {budget['env_us']:.0f} us, leaving {budget['left_us']:.0f} us for the policy and "
        f"the replay writes; the forward pass alone takes {budget['forward_us']:.0f} us "
        f"({budget['forward_bfloat16_us']:.0f} in bfloat16); the actor spends {budget['actor_us']:.0f} us"
    )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                dict(
                    env=args.env,
                    num_envs=args.num_envs,
                    raw_agent_steps_per_second=raw,
                    learner_gradient_steps_per_second=grads,
                    network_ms=costs,
                    arithmetic_ceiling=ceiling,
                    collection=col,
                    actor_budget=budget,
                ),
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
