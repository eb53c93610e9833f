"""Batched env backends: shapes, SAME_STEP autoreset, errors (a few seconds)."""

import importlib.util
import sys

import numpy as np
import pytest
from helpers import rlfleet

from rlfleet.envs.core import BACKENDS, EnvError, env_seeds, env_spec, make_batched_env

HAVE_ENVPOOL = importlib.util.find_spec("envpool") is not None


def _backend(name):
    if name == "envpool" and not HAVE_ENVPOOL:
        pytest.skip("envpool not installed (pip install envpool==1.2.5)")
    return name


def _cheetah_reset_like(obs):
    """HalfCheetah-v5 reset: joint positions init + U(-0.1, 0.1), velocities 0.1 * N(0, 1).

    Mid-episode observations under random actions never pass this (their largest
    |velocity| is > 1 in every one of 20k checked steps); a reset one always does.
    """
    return np.abs(obs[:8]).max() <= 0.1 + 1e-6 and np.abs(obs[8:]).max() < 1.0


def _hopper_reset_like(obs):
    """Hopper-v5 reset: qpos = [., 1.25, 0...] + U(-0.005, 0.005), qvel = U(-0.005, 0.005)."""
    init = np.zeros(11)
    init[0] = 1.25
    return np.abs(obs - init).max() <= 0.005 + 1e-6


@pytest.mark.parametrize("backend", ["async", "sync", "workers", "envpool"])
def test_cheetah_time_limit_resets_in_the_same_step(backend):
    venv = make_batched_env("HalfCheetah-v5", 2, _backend(backend))
    try:
        assert venv.single_observation_space.shape == (17,)
        rng = np.random.default_rng(0)
        obs, _ = venv.reset(seed=[0, 1])
        assert obs.shape == (2, 17) and all(_cheetah_reset_like(o) for o in obs)
        truncated_at, rewards_after = [], None
        for t in range(1, 1101):
            obs, reward, terminated, truncated, _ = venv.step(rng.uniform(-1, 1, (2, 6)))
            assert obs.shape == (2, 17) and reward.shape == terminated.shape == truncated.shape == (2,)
            assert not terminated.any()  # HalfCheetah never terminates
            if truncated.any():
                truncated_at.append(t)
                assert truncated.all()  # both started together
                # the returned obs is already the first one of the next episode
                assert all(_cheetah_reset_like(o) for o in obs)
            else:
                assert not any(_cheetah_reset_like(o) for o in obs)
            if t == 1001:
                rewards_after = reward
        assert truncated_at == [1000]
        # step 1001 is a real step of the new episode (control cost != 0), not a
        # reset transition that ignores its action (reward 0)
        assert np.all(rewards_after != 0.0)
    finally:
        venv.close()


@pytest.mark.parametrize("backend", ["async", "sync", "workers", "envpool"])
def test_hopper_per_env_resets(backend):
    """Hopper episodes end at different steps; only the finished envs are reset."""
    venv = make_batched_env("Hopper-v5", 3, _backend(backend))
    try:
        rng = np.random.default_rng(1)
        obs, _ = venv.reset(seed=[10, 11, 12])
        assert all(_hopper_reset_like(o) for o in obs)
        ends = 0
        for _ in range(150):
            obs, reward, terminated, truncated, _ = venv.step(rng.uniform(-1, 1, (3, 3)))
            done = terminated | truncated
            ends += int(done.sum())
            for i in range(3):
                assert _hopper_reset_like(obs[i]) == bool(done[i])
            assert np.all(reward != 0.0)  # healthy reward; no ignored-action reset steps
        assert ends >= 6  # random-action Hopper episodes last ~10-60 steps
    finally:
        venv.close()


def test_envpool_seeded_reset_is_reproducible():
    venv = make_batched_env("HalfCheetah-v5", 2, _backend("envpool"))
    try:
        a, _ = venv.reset(seed=[3, 4])
        venv.step(np.zeros((2, 6)))
        b, _ = venv.reset(seed=[3, 4])
        c, _ = venv.reset(seed=[5, 6])
        np.testing.assert_array_equal(a, b)
        assert not np.allclose(a, c) and not np.allclose(a[0], a[1])
    finally:
        venv.close()


def test_envpool_missing_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "envpool", None)  # makes `import envpool` fail
    with pytest.raises(EnvError, match=r"pip install envpool==1.2.5"):
        make_batched_env("HalfCheetah-v5", 2, "envpool")


@pytest.mark.parametrize("backend", BACKENDS)
def test_unknown_env_id(backend):
    if backend == "envpool" and not HAVE_ENVPOOL:
        pytest.skip("envpool not installed")
    with pytest.raises(EnvError, match="NoSuchEnv-v0"):
        make_batched_env("NoSuchEnv-v0", 2, backend)


def test_misspelled_env_id_keeps_gymnasiums_suggestion_as_a_sentence():
    with pytest.raises(EnvError) as e:
        make_batched_env("CartPol-v1", 2, "sync")
    message = str(e.value)
    assert "Did you mean: `CartPole`? Use a gymnasium id" in message and "?." not in message


@pytest.mark.parametrize(
    "legacy, v5", [("PongNoFrameskip-v4", "ALE/Pong-v5"), ("SpaceInvaders-v0", "ALE/SpaceInvaders-v5")]
)
def test_legacy_atari_ids_point_to_the_v5_id(legacy, v5):
    with pytest.raises(EnvError, match=f"--env {v5}"):
        env_spec(legacy)


def test_env_envpool_lacks_or_cannot_match():
    _backend("envpool")
    with pytest.raises(EnvError, match=r"CartPole-v1.*leave --env-backend at auto"):
        make_batched_env("CartPole-v1", 2, "envpool")  # discrete actions


def test_unknown_backend():
    with pytest.raises(EnvError, match="'threads'"):
        make_batched_env("HalfCheetah-v5", 2, "threads")


def _reference_final_obs(backend, seeds, actions):
    """The observation each env returns at its time limit, stepped natively with the same seeds and actions:
    one gymnasium env per seed for the gymnasium backends, envpool's own (next-step autoreset) pool for envpool."""
    if backend == "envpool":
        import envpool

        pool = envpool.make_gymnasium(
            "HalfCheetah-v5", num_envs=len(seeds), batch_size=len(seeds), env_seed=list(seeds), max_episode_steps=1000
        )
        pool.reset()
        for a in actions:
            obs, _, _, truncated, _ = pool.step(np.asarray(a, np.float64))
        pool.close()
        assert truncated.all()
        return obs
    import gymnasium as gym

    out = []
    for i, seed in enumerate(seeds):
        env = gym.make("HalfCheetah-v5")
        env.reset(seed=seed)
        for a in actions:
            obs, _, _, truncated, _ = env.step(a[i])
        env.close()
        assert truncated
        out.append(obs)
    return np.stack(out)


@pytest.mark.parametrize("backend", ["async", "sync", "workers", "envpool"])
def test_truncation_keeps_the_final_observation_for_bootstrapping(backend):
    """At a time limit every backend hands the actor the cut episode's true last observation
    (what PPO bootstraps from), while the returned observation already starts the next episode."""
    from rlfleet.envs.core import truncation_observations

    venv = make_batched_env("HalfCheetah-v5", 2, _backend(backend))
    try:
        rng = np.random.default_rng(3)
        actions = rng.uniform(-1, 1, (1000, 2, 6)).astype(np.float32)
        obs, _ = venv.reset(seed=[5, 6])
        for t, a in enumerate(actions):
            obs, _, terminated, truncated, info = venv.step(a)
            final = truncation_observations(obs, terminated, truncated, info)
            if t < 999:
                assert not truncated.any() and not final.any()
        assert truncated.all() and not terminated.any()
        assert all(_cheetah_reset_like(o) for o in obs) and not any(_cheetah_reset_like(f) for f in final)
        np.testing.assert_allclose(final, _reference_final_obs(backend, [5, 6], actions), rtol=1e-5, atol=1e-5)
    finally:
        venv.close()


def test_terminated_episodes_give_no_bootstrap_observation():
    from rlfleet.envs.core import truncation_observations

    venv = make_batched_env("Hopper-v5", 4, "sync")
    try:
        venv.reset(seed=[0, 1, 2, 3])
        rng = np.random.default_rng(0)
        seen = 0
        for _ in range(300):
            obs, _, terminated, truncated, info = venv.step(rng.uniform(-1, 1, (4, 3)))
            final = truncation_observations(obs, terminated, truncated, info)
            assert not final[terminated].any()  # a terminal state: nothing to bootstrap from
            seen += int(terminated.sum())
        assert seen > 0  # random Hopper falls within 300 steps
    finally:
        venv.close()


def test_auto_stays_auto_but_for_atari_and_a_named_backend_is_kept():
    from rlfleet.envs.core import resolve_backend

    assert resolve_backend("ALE/Pong-v5", "auto") == "ale"
    for env_id in ("CartPole-v1", "HalfCheetah-v5"):  # chosen by measurement on the actor (test_backend_choice)
        assert resolve_backend(env_id, "auto") == "auto"
    for backend in ("sync", "workers", "envpool", "async"):
        assert resolve_backend("HalfCheetah-v5", backend) == backend
    with pytest.raises(EnvError, match="leave --env-backend at auto"):
        resolve_backend("ALE/Pong-v5", "workers")


def test_no_settotalmass_warning_from_any_halfcheetah_start():
    """MuJoCo 4 warns that gymnasium's HalfCheetah XML uses the deprecated `settotalmass` at every model load;
    the actors' backends and the evaluator start HalfCheetah without printing it, and other MuJoCo warnings
    still reach stderr."""
    import subprocess
    import sys

    code = (
        "from rlfleet.envs.core import make_batched_env, make_env\n"
        "import mujoco\n"
        "if __name__ == '__main__':\n"
        "    for backend in ('async', 'sync'):\n"
        "        v = make_batched_env('HalfCheetah-v5', 2, backend); v.reset(seed=0); v.close()\n"
        "    make_env('HalfCheetah-v5').close()\n"
        "    mujoco.get_mju_user_warning()('a different MuJoCo warning')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(__import__("pathlib").Path(__file__).resolve().parents[1]),
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "settotalmass" not in out.stdout + out.stderr
    assert "a different MuJoCo warning" in out.stderr


@pytest.mark.parametrize("env_id,backend", [("ALE/Pong-v5", "ale"), ("HalfCheetah-v5", "envpool")])
def test_seeds_past_what_a_backend_takes_are_folded_into_its_range(env_id, backend):
    """The largest run seed plus an actor's offsets passes 2**31, which ALE and envpool refuse."""
    seeds = env_seeds(2**31 - 1 + 1000 * 512, 2)
    assert seeds == [(2**31 - 1 + 512_000) % 2**31, (2**31 + 512_000) % 2**31]
    assert env_seeds(2**31 - 1, 2) == [2**31 - 1, 0]
    venv = make_batched_env(env_id, 2, _backend(backend))
    try:
        a, _ = venv.reset(seed=seeds)
        b, _ = venv.reset(seed=seeds)
        np.testing.assert_array_equal(a, b)
    finally:
        venv.close()


def test_a_run_seed_out_of_range_is_refused_before_anything_starts(tmp_path):
    out = rlfleet(
        "up", "--algo", "ppo", "--env", "Hopper-v5", "--total-steps", 100, "--logdir", tmp_path / "r", "--seed", 2**31
    )
    assert out.returncode == 2 and "--seed" in out.stderr and "2147483647" in out.stderr, out.stderr[-2000:]
    assert not (tmp_path / "r").exists()
