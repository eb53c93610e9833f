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
