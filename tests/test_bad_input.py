"""Bad input fails fast with a message that names the problem."""
import time

from conftest import rlfleet


def test_unknown_env_id_fails_fast(tmp_path):
    start = time.time()
    out = rlfleet("up", "--algo", "ppo", "--env", "HalfCheeta-v5", "--total-steps", "1000", "--logdir", tmp_path / "r",
                  timeout=120)
    assert out.returncode == 2
    assert "unknown or unavailable environment id 'HalfCheeta-v5'" in out.stderr
    assert time.time() - start < 60
    assert not (tmp_path / "r" / "logs").exists()  # nothing was started


def test_discrete_env_for_batchppo_fails_fast(tmp_path):
    out = rlfleet("up", "--algo", "ppo", "--env", "CartPole-v1", "--total-steps", "1000", "--logdir", tmp_path / "r",
                  timeout=120)
    assert out.returncode == 2
    assert "discrete action space" in out.stderr and "continuous" in out.stderr


def test_unknown_preset_and_setting(tmp_path):
    out = rlfleet("up", "--env", "InvertedPendulum-v5", "--total-steps", "1000", "--logdir", tmp_path / "r",
                  "--config", "fast", timeout=120)
    assert out.returncode == 2 and "unknown --config preset 'fast'" in out.stderr
    out = rlfleet("up", "--env", "InvertedPendulum-v5", "--total-steps", "1000", "--logdir", tmp_path / "r",
                  "--set", "learning_rat=1e-3", timeout=120)
    assert out.returncode == 2 and "learning_rat" in out.stderr


def test_status_of_unreachable_learner(free_port):
    start = time.time()
    out = rlfleet("status", "--learner", f"127.0.0.1:{free_port()}", "--timeout", "2", timeout=60)
    assert out.returncode != 0
    assert "cannot reach the learner" in out.stderr
    assert time.time() - start < 30


def test_used_logdir_needs_resume(tmp_path):
    (tmp_path / "r" / "checkpoints").mkdir(parents=True)
    (tmp_path / "r" / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-1"\n')
    out = rlfleet("up", "--env", "InvertedPendulum-v5", "--total-steps", "1000", "--logdir", tmp_path / "r", timeout=120)
    assert out.returncode == 2 and "already holds a run" in out.stderr and "--resume" in out.stderr
    out = rlfleet("up", "--env", "InvertedPendulum-v5", "--total-steps", "1000", "--logdir", tmp_path / "new",
                  "--resume", tmp_path, timeout=120)
    assert out.returncode == 2 and "no checkpoint found" in out.stderr


def test_resume_with_other_settings_is_refused(tmp_path):
    import json
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"algo": "ppo", "env_id": "InvertedPendulum-v5", "config": {}}))
    out = rlfleet("learner", "--env", "HalfCheetah-v5", "--replay", "127.0.0.1:1", "--logdir", run,
                  "--resume", run, timeout=120)
    assert out.returncode == 2
    assert "started with other settings" in out.stderr and "env_id: 'InvertedPendulum-v5' -> 'HalfCheetah-v5'" in out.stderr


def test_dqn_on_continuous_env_fails_fast(tmp_path):
    out = rlfleet("up", "--algo", "dqn", "--env", "HalfCheetah-v5", "--total-steps", "1000", "--logdir", tmp_path / "r",
                  timeout=120)
    assert out.returncode == 2 and "needs discrete actions" in out.stderr


def test_learner_port_in_use(tmp_path):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        out = rlfleet("up", "--env", "InvertedPendulum-v5", "--total-steps", "1000", "--logdir", tmp_path / "r",
                      "--learner-port", port, timeout=120)
    assert out.returncode == 2 and f"--learner-port {port} is in use" in out.stderr
    assert not (tmp_path / "r" / "logs").exists()
