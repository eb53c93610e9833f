"""Bad input fails fast with a message that names the problem."""

import json
import time

import pytest
from helpers import rlfleet


def test_unknown_env_id_fails_fast(tmp_path):
    start = time.monotonic()
    out = rlfleet(
        "up",
        "--algo",
        "ppo",
        "--env",
        "HalfCheeta-v5",
        "--total-steps",
        "1000",
        "--logdir",
        tmp_path / "r",
        timeout=120,
    )
    assert out.returncode == 2
    assert "unknown or unavailable environment id 'HalfCheeta-v5'" in out.stderr
    # The ids it suggests fit either kind of algorithm: discrete and continuous actions both named.
    assert "CartPole-v1" in out.stderr and "HalfCheetah-v5 (continuous" in out.stderr, out.stderr
    assert time.monotonic() - start < 60
    assert not (tmp_path / "r" / "logs").exists()  # nothing was started


def test_discrete_env_for_batchppo_fails_fast(tmp_path):
    out = rlfleet(
        "up", "--algo", "ppo", "--env", "CartPole-v1", "--total-steps", "1000", "--logdir", tmp_path / "r", timeout=120
    )
    assert out.returncode == 2
    assert "discrete action space" in out.stderr and "continuous" in out.stderr


@pytest.mark.parametrize("env_id, backend", [("ALE/Pong-v5", "workers"), ("CartPole-v1", "ale")])
def test_an_env_backend_that_cannot_step_the_env_is_refused_before_anything_starts(tmp_path, env_id, backend):
    run = tmp_path / "run"
    for command in ("up", "learner"):
        extra = ("--replay", "127.0.0.1:1") if command == "learner" else ()
        out = rlfleet(command, "--algo", "dqn", "--env", env_id, "--env-backend", backend, "--total-steps", 1000,
                      "--logdir", run, *extra, timeout=120)  # fmt: skip
        assert out.returncode == 2, out.stdout + out.stderr
        assert f"env backend {backend!r} does not fit {env_id}" in out.stderr
        assert "leave --env-backend at auto" in out.stderr
        assert not run.exists()  # nothing started, nothing written


@pytest.mark.parametrize(
    "algo, env_args, backend, said",
    [
        ("dqn", ["--env", "CartPole-v1"], "envpool", "the envpool backend handles Box"),  # envpool refuses its spaces
        ("ppo", ["--env", "HalfCheetah-v5", "--env-kwargs", "ctrl_cost_weight=0.2"], "envpool",
         "takes no --env-kwargs"),
        # a value the constructor keeps but the env cannot use: its first step fails, before any process starts
        ("ppo", ["--env", "HalfCheetah-v5", "--env-kwargs", "ctrl_cost_weight=abc"], "auto",
         "with --env-kwargs {'ctrl_cost_weight': 'abc'} failed in its first reset or step"),
    ],
)  # fmt: skip
def test_an_env_its_backend_or_its_kwargs_cannot_run_are_refused_before_anything_starts(
    tmp_path, algo, env_args, backend, said
):
    run = tmp_path / "run"
    for command in ("up", "learner"):
        extra = ("--replay", "127.0.0.1:1") if command == "learner" else ()
        out = rlfleet(command, "--algo", algo, *env_args, "--env-backend", backend, "--total-steps", 1000,
                      "--logdir", run, *extra, timeout=120)  # fmt: skip
        assert out.returncode == 2, out.stdout + out.stderr
        assert said in out.stderr and "Traceback" not in out.stderr, out.stderr
        assert not run.exists()  # nothing started, nothing written


def test_a_learner_is_given_exactly_the_replay_sources_its_algorithm_reads(tmp_path):
    """A replay source the algorithm does not read, one it reads but is not given, and one without an address are
    refused with the fix, before the learner waits for any replay server."""
    run, teacher = tmp_path / "run", tmp_path / "teacher"
    learner = ("learner", "--replay", "127.0.0.1:1", "--logdir", run, "--start-timeout", "5")
    out = rlfleet(*learner, "--algo", "ppo", "--env", "Pendulum-v1", "--replay-source", "teacher=127.0.0.1:2",
                  timeout=120)  # fmt: skip
    assert out.returncode == 2, out.stdout + out.stderr
    assert "--replay-source teacher: a ppo run has no replay source; leave it out." in out.stderr, out.stderr
    out = rlfleet(*learner, "--algo", "qdagger", "--env", "CartPole-v1", "--teacher", teacher, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    said = f"--algo qdagger reads the replay of its teacher ({teacher}): serve it with `rlfleet replay --teacher"
    assert said in out.stderr and "--replay-source teacher=HOST:PORT" in out.stderr, out.stderr
    out = rlfleet(*learner, "--algo", "qdagger", "--env", "CartPole-v1", "--teacher", teacher,
                  "--replay-source", "127.0.0.1:2", timeout=120)  # fmt: skip
    assert out.returncode == 2 and "give NAME=HOST:PORT" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.slow
def test_unknown_preset_and_setting(tmp_path):
    out = rlfleet(
        "up",
        "--env",
        "InvertedPendulum-v5",
        "--total-steps",
        "1000",
        "--logdir",
        tmp_path / "r",
        "--config",
        "fast",
        timeout=120,
    )
    assert out.returncode == 2 and "unknown --config preset 'fast'" in out.stderr
    out = rlfleet(
        "up",
        "--env",
        "InvertedPendulum-v5",
        "--total-steps",
        "1000",
        "--logdir",
        tmp_path / "r",
        "--set",
        "learning_rat=1e-3",
        timeout=120,
    )
    assert out.returncode == 2 and "learning_rat" in out.stderr


def test_status_of_unreachable_learner(free_port):
    start = time.monotonic()
    out = rlfleet("status", "--learner", f"127.0.0.1:{free_port()}", "--timeout", "2", timeout=60)
    assert out.returncode != 0
    assert "cannot reach the learner" in out.stderr
    assert time.monotonic() - start < 30


@pytest.mark.slow
def test_used_logdir_needs_resume(tmp_path):
    (tmp_path / "r" / "checkpoints").mkdir(parents=True)
    (tmp_path / "r" / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-1"\n')
    out = rlfleet(
        "up", "--env", "InvertedPendulum-v5", "--total-steps", "1000", "--logdir", tmp_path / "r", timeout=120
    )
    assert out.returncode == 2 and "already holds a run" in out.stderr and "--resume" in out.stderr
    out = rlfleet(
        "up",
        "--env",
        "InvertedPendulum-v5",
        "--total-steps",
        "1000",
        "--logdir",
        tmp_path / "new",
        "--resume",
        tmp_path,
        timeout=120,
    )
    assert out.returncode == 2 and "no checkpoint found" in out.stderr
    out = rlfleet("up", "--env", "InvertedPendulum-v5", "--total-steps", "1000", timeout=120)
    assert out.returncode == 2 and "Missing option '--logdir'" in out.stderr and "--resume DIR" in out.stderr


def test_resume_with_other_settings_is_refused(tmp_path):
    import json

    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"algo": "ppo", "env_id": "InvertedPendulum-v5", "config": {}}))
    out = rlfleet(
        "learner", "--env", "HalfCheetah-v5", "--replay", "127.0.0.1:1", "--logdir", run, "--resume", run, timeout=120
    )
    assert out.returncode == 2
    assert (
        "started with other settings" in out.stderr
        and "env_id: 'InvertedPendulum-v5' -> 'HalfCheetah-v5'" in out.stderr
    )


def test_up_resume_with_other_settings_fails_before_starting(tmp_path):
    import json

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-1"\n')
    (run / "run.json").write_text(json.dumps({"algo": "dqn", "env_id": "CartPole-v1", "config": {}}))
    out = rlfleet("up", "--algo", "dqn", "--env", "Acrobot-v1", "--total-steps", "1000", "--resume", run, timeout=120)
    assert out.returncode == 2
    assert "env_id: 'CartPole-v1' -> 'Acrobot-v1'" in out.stderr and "resume it with the same" in out.stderr
    assert not (run / "logs").exists()  # no process was started


def test_up_resume_alone_takes_the_run_and_refuses_what_does_not_fit(tmp_path):
    """`up --resume DIR` alone reads DIR/run.json; a seed other than the run's, no run.json, a damaged one, or a run
    that records no budget are refused before anything starts, each naming the fix."""
    import json

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-1"\n')
    recorded = {"algo": "dqn", "env_id": "CartPole-v1", "preset": "default", "config": {}, "seed": 7}
    (run / "run.json").write_text(json.dumps(recorded))
    out = rlfleet("up", "--resume", run, timeout=120)  # this run.json records no budget
    assert out.returncode == 2 and "Missing option '--total-steps'" in out.stderr, out.stderr
    (run / "run.json").write_text(json.dumps(dict(recorded, total_steps=0)))
    out = rlfleet("up", "--resume", run, timeout=120)
    assert out.returncode == 2 and "--total-steps 0: the budget must be a positive" in out.stderr, out.stderr
    out = rlfleet("up", "--resume", run, "--total-steps", "-5", timeout=120)
    assert out.returncode == 2 and "'--total-steps': -5 is not in the range" in out.stderr, out.stderr
    (run / "run.json").write_text(json.dumps(dict(recorded, total_steps=1000)))
    out = rlfleet("up", "--resume", run, "--seed", "8", timeout=120)
    assert out.returncode == 2 and "seed: 7 -> 8" in out.stderr and "--resume" in out.stderr, out.stderr
    out = rlfleet("up", "--resume", run, "--show-config", timeout=120)  # the run's own settings
    assert out.returncode == 0 and "dqn" in out.stdout and "CartPole-v1" in out.stdout, out.stdout + out.stderr
    (run / "run.json").write_text('{"algo": "dqn", "env_id": ')
    out = rlfleet("up", "--resume", run, timeout=120)
    assert out.returncode == 2 and f"--resume {run}: {run / 'run.json'}: cannot read it" in out.stderr, out.stderr
    (run / "run.json").unlink()
    out = rlfleet("up", "--resume", run, timeout=120)
    assert out.returncode == 2 and "no run.json there" in out.stderr, out.stderr
    assert not (run / "logs").exists()  # no process was started


def test_dqn_on_continuous_env_fails_fast(tmp_path):
    out = rlfleet(
        "up",
        "--algo",
        "dqn",
        "--env",
        "HalfCheetah-v5",
        "--total-steps",
        "1000",
        "--logdir",
        tmp_path / "r",
        timeout=120,
    )
    assert out.returncode == 2 and "needs discrete actions" in out.stderr


def test_learner_port_in_use(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        out = rlfleet(
            "up",
            "--env",
            "InvertedPendulum-v5",
            "--total-steps",
            "1000",
            "--logdir",
            tmp_path / "r",
            "--learner-port",
            port,
            timeout=120,
        )
    assert out.returncode == 2 and f"port {port} is held by another process" in out.stderr, out.stderr
    assert "--learner-port" in out.stderr
    assert not (tmp_path / "r" / "logs").exists()


@pytest.mark.slow
def test_bind_addresses_are_bound_as_written_or_refused_with_the_reason(procs, free_port, tmp_path):
    import socket

    from helpers import status_or_none, wait_for

    # An address of no interface here: said so, before anything starts (nothing is sent to it).
    out = rlfleet(
        "up", "--env", "InvertedPendulum-v5", "--total-steps", "1000", "--logdir", tmp_path / "r", "--bind",
        "10.255.255.1", timeout=120,
    )  # fmt: skip
    assert out.returncode == 2 and "10.255.255.1 is not an address of this machine" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "r" / "logs").exists()
    # IPv6 loopback, with or without brackets, and a host name: bound as written.
    if not socket.has_ipv6:
        return
    try:
        socket.create_server(("::1", 0), family=socket.AF_INET6).close()
    except OSError:
        return  # no IPv6 loopback on this host
    dqn = ("--algo", "dqn", "--env", "CartPole-v1")
    replay_port = free_port()
    replay = procs.start("replay", "replay", *dqn, "--port", replay_port)
    wait_for(lambda: "serving on port" in replay.output(), 120, "the replay server", [replay])
    for i, bind in enumerate(["::1", "[::1]", "localhost"]):
        port = free_port()
        learner = procs.start(
            f"learner-{i}", "learner", *dqn, "--replay", f"127.0.0.1:{replay_port}", "--port", port, "--bind", bind,
            "--logdir", tmp_path / f"l{i}",
        )  # fmt: skip
        address = f"{'[::1]' if '::1' in bind else bind}:{port}"
        assert wait_for(lambda a=address: status_or_none(a), 120, f"the learner on {bind}", [learner])
        learner.stop()


@pytest.mark.slow
def test_malformed_config_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("learning_rate = 1e-4\nhidden [64, 64]\n")
    out = rlfleet(
        "up",
        "--algo",
        "dqn",
        "--env",
        "CartPole-v1",
        "--total-steps",
        "1000",
        "--logdir",
        tmp_path / "r",
        "--config-file",
        bad,
        timeout=120,
    )
    assert out.returncode == 2 and f"--config-file {bad}: not valid TOML" in out.stderr and "line 2" in out.stderr
    assert not (tmp_path / "r" / "logs").exists()  # nothing was started
    typo = tmp_path / "typo.toml"
    typo.write_text("learning_rat = 1e-4\n")
    out = rlfleet(
        "learner",
        "--algo",
        "dqn",
        "--env",
        "CartPole-v1",
        "--replay",
        "127.0.0.1:1",
        "--logdir",
        tmp_path / "r",
        "--config-file",
        typo,
        timeout=120,
    )
    assert out.returncode == 2 and "unknown DQN setting(s) ['learning_rat']" in out.stderr
    wrong = tmp_path / "wrong.toml"
    wrong.write_text('n_step = "three"\n[replay]\nsize = 10\n')
    out = rlfleet("replay", "--algo", "dqn", "--env", "CartPole-v1", "--port", "1", "--config-file", wrong, timeout=120)
    assert out.returncode == 2 and "['replay'] are not settings" in out.stderr
    wrong.write_text('n_step = "three"\n')
    out = rlfleet("replay", "--algo", "dqn", "--env", "CartPole-v1", "--port", "1", "--config-file", wrong, timeout=120)
    assert out.returncode == 2 and "n_step = 'three': expected an integer" in out.stderr


def test_actor_with_another_env_spec_is_refused(tmp_path, free_port):
    """A learner (here a stand-in gRPC server on a real socket) announcing CartPole with 5-dim observations and
    3 actions: a real actor process whose CartPole has 4 and 2 exits with the difference, writing nothing."""
    from concurrent import futures

    import grpc
    import reverb
    import tensorflow as tf

    from rlfleet.algorithms.dqn.config import DQNConfig
    from rlfleet.algorithms.dqn.items import dqn_tables
    from rlfleet.proto import rlfleet_pb2, rlfleet_pb2_grpc

    replay = reverb.Server(dqn_tables((4,), tf.float32, DQNConfig(n_step=3, replay_size=1000, min_replay_size=10)))
    heartbeats = []

    class Learner(rlfleet_pb2_grpc.LearnerServicer):
        def RegisterActor(self, request, context):
            net = rlfleet_pb2.NetworkSpec(observation_shape=[5], frame_stack=1, num_actions=3, network="mlp")
            return rlfleet_pb2.RegisterActorResponse(
                actor_id=0,
                config=rlfleet_pb2.RunConfig(
                    algo="dqn",
                    env_id="CartPole-v1",
                    replay_address=f"127.0.0.1:{replay.port}",
                    table="dqn_replay",
                    num_envs=2,
                    unroll_length=3,
                    network=net,
                    env_backend="sync",
                ),
            )

        def Heartbeat(self, request, context):
            heartbeats.append(request.env_steps)
            return rlfleet_pb2.HeartbeatResponse()

    server = grpc.server(futures.ThreadPoolExecutor(4))
    rlfleet_pb2_grpc.add_LearnerServicer_to_server(Learner(), server)
    port = server.add_insecure_port(f"127.0.0.1:{free_port()}")
    server.start()
    try:
        out = rlfleet("actor", "--learner", f"127.0.0.1:{port}", timeout=120)
    finally:
        server.stop(0)
    assert out.returncode == 2
    assert "does not match the learner's" in out.stderr
    assert "observation_shape (4,) here, (5,) at the learner" in out.stderr and "actions 2 here, 3" in out.stderr
    assert reverb.Client(f"127.0.0.1:{replay.port}").server_info()["dqn_replay"].current_size == 0
    assert not any(heartbeats)  # no env step was reported either
    replay.stop()


def test_resume_with_other_settings_than_the_run_recorded_is_refused(tmp_path):
    """Resuming with a setting other than the one run.json records is refused (its checkpoint holds another
    network or rule), naming the setting and both values; the same settings resume."""
    import json

    from rlfleet.algorithms.settings import RunSettings
    from rlfleet.learner.run_dir import RunDirError, check_run_dir

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-1"\n')
    today = RunSettings.resolve("dqn", "CartPole-v1")
    old = today.to_json()
    old["config"]["double_q"] = False
    (run / "run.json").write_text(json.dumps(old))
    with pytest.raises(RunDirError, match="double_q: False -> True"):
        check_run_dir(str(run), str(run), today)
    (run / "run.json").write_text(json.dumps(today.to_json()))
    check_run_dir(str(run), str(run), today)  # the same settings resume


def test_run_files_hold_valid_json_where_a_value_is_not_measured_yet(tmp_path):
    """summary.json / run.json: a NaN (e.g. QDagger's student score before its window filled) is written as
    null, since JSON has no NaN and strict readers (jq, JavaScript) refuse the file otherwise."""
    import json
    import math

    from rlfleet.learner.run_dir import write_json

    path = tmp_path / "summary.json"
    write_json(str(path), {"a": math.nan, "b": [1.0, math.inf], "c": {"d": 2.5}, "e": "x"})

    def strict(name):
        raise ValueError(name)

    expected = {"a": None, "b": [1.0, None], "c": {"d": 2.5}, "e": "x"}
    assert json.loads(path.read_text(), parse_constant=strict) == expected


@pytest.mark.slow
def test_a_second_server_on_a_held_port_fails(procs, free_port, tmp_path):
    """gRPC and Reverb set SO_REUSEPORT: without a check, a second server on a held port starts and splits
    the clients between the two. Each service refuses such a port at start instead."""
    from helpers import wait_for

    replay_port, learner_port = free_port(), free_port()
    dqn = ("--algo", "dqn", "--env", "CartPole-v1")
    replay = procs.start("replay", "replay", *dqn, "--port", replay_port)
    wait_for(lambda: "serving on port" in replay.output(), 120, "the replay server", [replay])
    second = rlfleet("replay", *dqn, "--port", replay_port, timeout=120)
    assert second.returncode == 2 and f"cannot start the replay server on port {replay_port}" in second.stderr
    assert "held by another process" in second.stderr and replay.proc.poll() is None
    learner_args = ("learner", *dqn, "--replay", f"127.0.0.1:{replay_port}", "--port", learner_port)
    learner = procs.start("learner", *learner_args, "--logdir", tmp_path / "a")
    wait_for(lambda: "serving on" in learner.output(), 120, "the learner", [replay, learner])
    again = rlfleet(*learner_args, "--logdir", tmp_path / "b", timeout=120)
    assert again.returncode == 2 and f"cannot bind the learner service to 127.0.0.1:{learner_port}" in again.stderr
    assert learner.proc.poll() is None


@pytest.mark.slow
def test_replay_refuses_a_checkpoint_written_with_other_settings(procs, free_port, tmp_path):
    """Reverb replaces the tables a server is started with by those of the checkpoint it restores; a replay
    server whose checkpoint was written for other settings (another env, another replay size) refuses to
    start instead of serving tables the learner did not ask for. With the same settings it restores."""
    from helpers import wait_for

    ckpt, port = tmp_path / "replay", free_port()
    cartpole = ("--algo", "dqn", "--env", "CartPole-v1", "--checkpoint-dir", ckpt)
    replay = procs.start("replay", "replay", *cartpole, "--port", port)
    wait_for(lambda: "serving on port" in replay.output(), 120, "the replay server", [replay])
    out = rlfleet("replay-checkpoint", "--replay", f"127.0.0.1:{port}", timeout=120)
    assert out.returncode == 0, out.stderr
    assert replay.stop() == 0
    from rlfleet.algorithms.settings import make_algo_config
    from rlfleet.envs.core import env_spec
    from rlfleet.replay.server import tables_for

    cfg = make_algo_config("dqn", "default", "CartPole-v1")
    [table] = tables_for("dqn", env_spec("CartPole-v1"), cfg)
    for other, differs in (
        (("--algo", "dqn", "--env", "Acrobot-v1"), "item signature"),
        (
            ("--algo", "dqn", "--env", "CartPole-v1", "--set", "replay_size=5000"),
            f"max_size {table.info.max_size} in the checkpoint",
        ),
    ):
        out = rlfleet("replay", *other, "--checkpoint-dir", ckpt, "--port", free_port(), timeout=120)
        assert out.returncode == 2, out.stdout + out.stderr
        assert "was written with other settings" in out.stderr and differs in out.stderr, out.stderr
    again = procs.start("replay-again", "replay", *cartpole, "--port", free_port())
    wait_for(lambda: "serving on port" in again.output(), 120, "the same settings to restore", [again])


@pytest.mark.slow
def test_a_run_directory_keeps_its_settings(tmp_path, free_port):
    """`replay --settings-out` (what compose's replay service runs) writes a run's settings once; a restart with the
    same settings reads them back, one with other settings is refused before anything is served."""
    out_file = tmp_path / "run" / "settings.json"
    out = rlfleet("settings", "--algo", "dqn", "--env", "CartPole-v1", "--out", out_file, timeout=120)
    assert out.returncode == 0, out.stderr
    written = out_file.read_text()
    out = rlfleet("settings", "--algo", "dqn", "--env", "CartPole-v1", "--out", out_file, timeout=120)
    assert out.returncode == 0 and "holds these settings already" in out.stdout, out.stdout + out.stderr
    args = ["--env", "CartPole-v1", "--set", "learning_rate=0.01", "--settings-out", out_file, "--port", free_port()]
    out = rlfleet("replay", "--algo", "dqn", *args, timeout=120)
    assert out.returncode == 2
    assert "learning_rate: 0.0023 -> 0.01" in out.stderr and "RLFLEET_RUN" in out.stderr, out.stderr
    assert "serving" not in out.stdout
    assert out_file.read_text() == written


@pytest.mark.slow
def test_auto_resume_does_not_resume_a_failed_run(tmp_path):
    """A supervisor's restart (--auto-resume) of a learner whose run failed stops at once with the recorded fault,
    rather than resume into the same divergence."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-1"\n')
    fault = "non-finite loss (q_loss = nan) at learner step 120."
    summary = {"completed": False, "fault": fault, "checkpoint": str(run / "checkpoints" / "ckpt-1")}
    (run / "summary.json").write_text(json.dumps(summary))
    learner = ["learner", "--algo", "dqn", "--env", "CartPole-v1", "--replay", "127.0.0.1:1", "--logdir", run]
    out = rlfleet(*learner, "--auto-resume", timeout=120)
    assert out.returncode == 2
    assert fault in out.stderr and "Not resuming" in out.stderr, out.stderr
    # A run resumed by hand since, and checkpointed later, is not held to the old fault (this learner then fails
    # for want of its replay server).
    (run / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-2"\n')
    out = rlfleet(*learner, "--auto-resume", timeout=300)
    assert out.returncode != 0 and "Not resuming" not in out.stderr, out.stderr


@pytest.mark.slow
def test_more_envs_than_the_open_file_limit_allows_are_refused_with_the_limit_and_the_fix(procs, free_port, tmp_path):
    """An actor machine whose open-file limit cannot hold the run's envs (here 64 env processes on `async` under a
    hard limit of 200) says so before it makes them, with the limit and the fix, instead of an OSError traceback."""
    import resource
    import subprocess
    import sys

    from helpers import ENV, ROOT, start_replay_and_learner, status_or_none, wait_for

    settings = ("--algo", "dqn", "--env", "CartPole-v1", "--set", "envs_per_actor=64")
    _, learner, address = start_replay_and_learner(procs, free_port, settings, tmp_path / "run")
    wait_for(lambda: status_or_none(address), 180, "the learner", [learner])
    actor = subprocess.run(
        [sys.executable, "-m", "rlfleet.deploy.cli", "actor", "--learner", address, "--env-backend", "async"],
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (200, 200)),
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert actor.returncode == 2, actor.stdout + actor.stderr
    said = "64 envs on the async backend need about 256 open files besides the"
    assert said in actor.stderr and "limit of open files is 200" in actor.stderr, actor.stderr
    assert "ulimit -n" in actor.stderr and "--envs-per-actor" in actor.stderr and "Traceback" not in actor.stderr


def test_a_wildcard_bind_announces_an_address_actors_reach_or_is_refused(tmp_path, monkeypatch):
    """`up --bind 0.0.0.0` tells actors the replay server at an address of this machine that they reach:
    --advertise, else what the host name resolves to; where that is loopback alone it is refused, naming
    --advertise (before anything starts). The run itself, with --advertise, is in test_wildcard_bind_run."""
    from rlfleet.deploy import launcher
    from rlfleet.deploy.up_options import UpOptions

    monkeypatch.setattr(launcher, "routable_address", lambda: None)
    with pytest.raises(launcher.LaunchError, match="give --advertise ADDR"):
        launcher._advertised(UpOptions(str(tmp_path), bind="0.0.0.0"))
    assert launcher._advertised(UpOptions(str(tmp_path), bind="::", advertise="10.1.2.3")) == "10.1.2.3"
    monkeypatch.setattr(launcher, "routable_address", lambda: "192.0.2.7")
    assert launcher._advertised(UpOptions(str(tmp_path), bind="0.0.0.0")) == "192.0.2.7"
    assert launcher._advertised(UpOptions(str(tmp_path), bind="192.0.2.8")) == "192.0.2.8"
    assert launcher._advertised(UpOptions(str(tmp_path))) is None  # loopback: the cluster stays on this machine
    with pytest.raises(launcher.LaunchError, match="no other machine could reach it"):
        launcher._advertised(UpOptions(str(tmp_path), advertise="10.1.2.3"))  # a learner on loopback
    with pytest.raises(launcher.LaunchError, match="without a port"):
        launcher._advertised(UpOptions(str(tmp_path), bind="0.0.0.0", advertise="10.1.2.3:8001"))


@pytest.mark.slow
def test_wildcard_bind_run(tmp_path):
    """A run bound to every interface with --advertise: its actor is told the replay server at the advertised
    address (here 127.0.0.2, a loopback address too, so nothing leaves the machine) and the run finishes."""
    from helpers import ENV

    run = tmp_path / "run"
    env = dict(ENV, RLFLEET_TOKEN="wildcard-test")  # listening on every interface: not without a token
    out = rlfleet("up", "--algo", "dqn", "--env", "CartPole-v1", "--set", "min_replay_size=200", "--total-steps",
                  1500, "--bind", "0.0.0.0", "--advertise", "127.0.0.2", "--logdir", run, env=env,
                  timeout=600)  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "attach with: rlfleet actor --learner 127.0.0.2:" in out.stdout
    assert " writing to replay at 127.0.0.2:" in (run / "logs" / "actor-0.log").read_text()
