"""A diverging learner (a learning rate far too large) publishes nothing non-finite: it stops with an error that
names the learner side and its settings, shows the fault in status, keeps only finite checkpoints, and its
actors stop without blaming their envs. Real replay, learner and actor processes on loopback; and a stand-in
learner that publishes NaN weights, which a real actor refuses to act with."""

import json

import numpy as np
import pytest
import tensorflow as tf
from helpers import rlfleet, start_replay_and_learner, status_or_none, wait_for

CASES = {
    # Adam moves every weight by about the learning rate per step: PPO's policy std overflows at once.
    "ppo": ("--algo", "ppo", "--env", "InvertedPendulum-v5", "--set", "learning_rate=1000"),
    # DQN's Huber loss keeps it finite at 1e6 (the policy is ruined, not NaN); at 1e20 the Q-values overflow within a
    # few gradient steps: one step per learner call, so that a checkpoint follows each and the finite ones are kept.
    "dqn": ("--algo", "dqn", "--env", "CartPole-v1", "--set", "learning_rate=1e20", "--set", "min_replay_size=300")
    + ("--set", "gradient_steps_per_call=1"),
}


@pytest.mark.slow
@pytest.mark.parametrize("algo", sorted(CASES))
def test_a_diverging_learner_stops_with_its_fault_and_keeps_finite_checkpoints(algo, procs, tmp_path, free_port):
    settings = CASES[algo]
    run = tmp_path / "run"
    replay, learner, address = start_replay_and_learner(
        procs,
        free_port,
        settings,
        run,
        "--checkpoint-interval",
        0,  # a checkpoint after every update: the last one before the divergence must stay the latest
        "--linger",
        5,  # status stays readable that long after the fault
    )
    wait_for(lambda: status_or_none(address), 120, "the learner", [replay, learner])
    checkpoints = str(run / "checkpoints")
    actor = procs.start("actor", "actor", "--learner", address)
    failed = wait_for(
        lambda: (s := status_or_none(address)) and s["phase"] == "failed" and s, 240, "the fault in status"
    )
    assert "training diverged" in failed["fault"] and "learning_rate=" in failed["fault"], failed
    assert learner.proc.wait(60) == 2
    out = learner.output()
    assert "training diverged" in out and "not the envs'" in out and "learning_rate=" in out, out[-3000:]
    assert actor.proc.wait(60) == 0, actor.output()[-3000:]  # told to stop; it does not blame its env
    assert "non-finite" not in actor.output() and "Fix the env" not in actor.output()

    summary = json.loads((run / "summary.json").read_text())
    assert summary["completed"] is False and summary["fault"] == failed["fault"]
    latest = tf.train.latest_checkpoint(checkpoints)
    assert latest and summary["checkpoint"] == latest, summary
    for ckpt in (run / "checkpoints").glob("ckpt-*.index"):
        reader = tf.train.load_checkpoint(str(ckpt)[: -len(".index")])
        for name in reader.get_variable_to_shape_map():
            value = np.asarray(reader.get_tensor(name))
            if value.dtype.kind == "f":
                assert np.isfinite(value).all(), (ckpt, name)


@pytest.mark.slow
def test_a_run_without_observation_clipping_is_not_taken_for_a_divergence(tmp_path):
    """PPO without observation normalization has no clip: it travels as float32's largest value, not +inf,
    so the finite-weights check passes (the Ant-v5 preset runs this way)."""
    run = tmp_path / "run"
    out = rlfleet(
        "up",
        "--algo",
        "ppo",
        "--env",
        "InvertedPendulum-v5",
        "--set",
        "obs_normalization=false",
        "--total-steps",
        3000,
        "--logdir",
        run,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert json.loads((run / "summary.json").read_text())["completed"] is True


def test_an_actor_refuses_non_finite_weights_and_names_the_learner(free_port):
    """A stand-in learner (a gRPC server on a real socket) publishing NaN Q-network weights."""
    from concurrent import futures

    import grpc
    import reverb

    from rlfleet.algorithms.dqn.config import DQNConfig
    from rlfleet.algorithms.dqn.items import dqn_tables
    from rlfleet.proto import arrays as proto_arrays
    from rlfleet.proto import rlfleet_pb2, rlfleet_pb2_grpc

    replay = reverb.Server(dqn_tables((4,), tf.float32, DQNConfig(n_step=2, replay_size=1000, min_replay_size=10)))
    weights = {"q/w0": np.full((4, 2), np.nan, np.float32), "q/b0": np.zeros(2, np.float32)}

    class Learner(rlfleet_pb2_grpc.LearnerServicer):
        def RegisterActor(self, request, context):
            net = rlfleet_pb2.NetworkSpec(observation_shape=[4], frame_stack=1, num_actions=2, network="mlp")
            config = rlfleet_pb2.RunConfig(
                algo="dqn",
                env_id="CartPole-v1",
                replay_address=f"127.0.0.1:{replay.port}",
                table="dqn_replay",
                num_envs=2,
                unroll_length=3,
                network=net,
                env_backend="sync",
            )
            return rlfleet_pb2.RegisterActorResponse(actor_id=0, config=config)

        def StreamWeights(self, request, context):
            yield proto_arrays.to_proto(0, weights, {"epsilon": 0.0})

        def Heartbeat(self, request, context):
            return rlfleet_pb2.HeartbeatResponse()

    server = grpc.server(futures.ThreadPoolExecutor(4))
    rlfleet_pb2_grpc.add_LearnerServicer_to_server(Learner(), server)
    port = server.add_insecure_port(f"127.0.0.1:{free_port()}")
    server.start()
    try:
        out = rlfleet("actor", "--learner", f"127.0.0.1:{port}", timeout=120)
    finally:
        server.stop(0)
    assert out.returncode == 2, out.stderr
    assert "NaN weights (q/w0)" in out.stderr and "learner's training diverged" in out.stderr, out.stderr
    assert "Fix the env" not in out.stderr
    assert reverb.Client(f"127.0.0.1:{replay.port}").server_info()["dqn_replay"].current_size == 0
    replay.stop()
