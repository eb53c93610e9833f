"""Replay, learner and actor as real processes talking over loopback sockets."""

import json
import socket

import numpy as np
import pytest
import reverb
from helpers import rlfleet, status_or_none, wait_for

from rlfleet.deploy.status import get_status

pytestmark = pytest.mark.slow

ENV_ID = "InvertedPendulum-v5"
SMALL = [
    "--set",
    "envs_per_actor=2",
    "--set",
    "unroll_length=16",
    "--set",
    "batch_env_steps=256",
    "--set",
    "epochs=2",
    "--set",
    "num_minibatches=2",
]


def start_replay_and_learner(procs, free_port, tmp_path, learner_extra=()):
    replay_port, learner_port = free_port(), free_port()
    replay = procs.start("replay", "replay", "--env", ENV_ID, "--port", replay_port, *SMALL)
    learner = procs.start(
        "learner",
        "learner",
        "--env",
        ENV_ID,
        "--replay",
        f"127.0.0.1:{replay_port}",
        "--logdir",
        tmp_path / "run",
        "--port",
        learner_port,
        "--report-interval",
        "1",
        *SMALL,
        "--set",
        "eval_every_updates=1000",
        *learner_extra,
    )
    address = f"127.0.0.1:{learner_port}"

    status = wait_for(lambda: status_or_none(address), 120, "learner status", [replay, learner])
    return replay, learner, address, replay_port, status


def test_actor_learner_replay_loop(procs, free_port, tmp_path):
    replay, learner, address, replay_port, st = start_replay_and_learner(procs, free_port, tmp_path)
    assert st["phase"] == "waiting_for_actors" and st["policy_version"] == 0 and st["actors"] == []
    assert st["replay"][0]["table"] == "ppo_trajectories" and st["replay"][0]["size"] == 0

    actor = procs.start("actor", "actor", "--learner", address, "--env-backend", "sync")
    st = wait_for(
        lambda: (
            (s := get_status(address, 2))["policy_version"] >= 3
            and s["actors"]
            and s["actors"][0]["policy_version"] >= 1
            and s
        ),
        180,
        "three learner updates seen by the actor",
        [replay, learner, actor],
    )
    assert st["phase"] == "training" and st["algo"] == "ppo" and st["env_id"] == ENV_ID
    assert st["learner_steps"] >= 3 * 2 * 2 and st["consumed_env_steps"] >= 3 * 256
    [a] = st["actors"]
    assert a["host"] == socket.gethostname() and a["num_envs"] == 2
    assert a["env_steps"] > 0 and a["policy_version"] >= 1 and a["seconds_since_heartbeat"] < 5
    assert a["env_backend"] == "sync" and a["env_backend_reason"] == "--env-backend sync (this actor)"
    assert "actor-0[" in actor.output() and " INFO env backend --env-backend sync (this actor)" in actor.output()
    assert st["env_steps"] >= st["consumed_env_steps"]
    table = st["replay"][0]
    assert table["inserts"] > 0 and table["samples"] > 0 and table["max_size"] >= 2
    assert st["episode_return_mean"] > 0  # actors report finished episodes

    # The CLI shows the same, for people and for scripts.
    out = rlfleet("status", "--learner", address, "--json")
    assert out.returncode == 0, out.stderr

    def strict(constant):
        raise AssertionError(f"status --json printed {constant}, which is not JSON")

    as_json = json.loads(out.stdout, parse_constant=strict)
    for field in (
        "algo",
        "env_id",
        "phase",
        "learner_steps",
        "env_steps",
        "policy_version",
        "weights_version",
        "algorithm_values",
        "episode_return_mean",
        "eval_return_mean",
        "env_steps_per_second",
        "learner_steps_per_second",
        "uptime_seconds",
        "actors",
        "replay",
    ):
        assert field in as_json, field
    # The algorithm's own values are also at the top level under their names; another algorithm's are not there.
    assert as_json["off_policy_env_steps"] == as_json["algorithm_values"]["off_policy_env_steps"] >= 0
    assert "distillation_coefficient" not in as_json and "teacher_eval_return_mean" not in as_json
    assert as_json["actors"][0]["num_envs"] == 2
    # weights_version is the status contract's name for the policy version.
    assert as_json["weights_version"] == as_json["policy_version"] >= 3
    table_out = rlfleet("status", "--learner", address)
    assert (
        table_out.returncode == 0 and "ppo_trajectories" in table_out.stdout and "InvertedPendulum" in table_out.stdout
    )

    # Malformed trajectories are rejected at insert with an error naming the problem.
    client = reverb.Client(f"127.0.0.1:{replay_port}")
    good = dict(
        observation=np.zeros((2, 4), np.float32),
        action=np.zeros((2, 1), np.float32),
        reward=np.zeros(2, np.float32),
        terminated=np.zeros(2, bool),
        truncated=np.zeros(2, bool),
        final_observation=np.zeros((2, 4), np.float32),
        discounted_return=np.zeros(2, np.float32),
        behaviour_log_prob=np.zeros(2, np.float32),
        behaviour_mean=np.zeros((2, 1), np.float32),
        behaviour_log_std=np.zeros((2, 1), np.float32),
        policy_version=np.zeros(2, np.int64),
    )
    bad_shape = dict(good, observation=np.zeros((2, 5), np.float32))
    bad_dtype = dict(good, reward=np.zeros(2, np.float64))
    for bad, word in ((bad_shape, "observation"), (bad_dtype, "reward")):
        with client.trajectory_writer(num_keep_alive_refs=17) as writer:
            for _ in range(17):
                writer.append(bad)
            with pytest.raises(Exception) as err:
                writer.create_item("ppo_trajectories", 1.0, {k: c[-17:] for k, c in writer.history.items()})
                writer.flush()
            assert "signature" in str(err.value).lower() or word in str(err.value), str(err.value)

    # ... and the cluster keeps serving and training.
    version = get_status(address, 2)["policy_version"]
    wait_for(
        lambda: get_status(address, 2)["policy_version"] > version + 1,
        120,
        "updates after the malformed inserts",
        [replay, learner, actor],
    )

    # SIGTERM: the learner checkpoints and exits cleanly.
    assert learner.stop() == 0
    assert list((tmp_path / "run" / "checkpoints").glob("ckpt-*.index"))
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows and rows[-1]["policy_version"] >= 3 and rows[-1]["weights_version"] == rows[-1]["policy_version"]


def test_learner_refuses_mismatched_replay(procs, free_port, tmp_path):
    replay_port = free_port()
    replay = procs.start("replay", "replay", "--env", ENV_ID, "--port", replay_port, *SMALL)
    wait_for(lambda: "serving" in replay.output(), 60, "replay start", [replay])
    out = rlfleet(
        "learner",
        "--env",
        ENV_ID,
        "--replay",
        f"127.0.0.1:{replay_port}",
        "--logdir",
        tmp_path / "run",
        *SMALL,
        "--set",
        "unroll_length=8",
        timeout=120,
    )
    assert out.returncode == 2
    assert "signature does not match" in out.stderr and "same --algo, --env, --config and --set" in out.stderr
