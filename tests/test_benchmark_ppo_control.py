"""benchmarks/ppo_control.py's report (curves on the evaluation grid, IQM bands, the control against the peer's band)
and the SB3 peer's mapping of the cleanrl preset (benchmarks/sb3_peer.py), without training anything."""

import argparse
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
sys.path.insert(0, BENCHMARKS)
import ppo_control  # noqa: E402
import sb3_peer  # noqa: E402

GRID = ppo_control.GRID


def _write_run(d, evals, *, final, eval_env_steps=True, seed=0, off_policy=None):
    """A run directory with an evaluation every GRID env steps; rows come later than the evaluations (rlfleet's
    rows carry the evaluation's own env steps in eval_env_steps), and a row of diagnostics between them."""
    os.makedirs(d)
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        for i, e in enumerate(evals):
            steps = GRID * (i + 1)
            row = dict(env_steps=steps + 5000, eval_return_mean=e, approx_kl=0.01 * (i + 1))
            if eval_env_steps:
                row["eval_env_steps"] = steps + 100
            else:
                row["env_steps"] = steps
            f.write(json.dumps(row) + "\n")
            f.write(json.dumps(dict(env_steps=steps + 6000, approx_kl=0.5 * (i + 1) + 0.1 * seed)) + "\n")
    steps = GRID * (len(evals) + 1)
    with open(os.path.join(d, "summary.json"), "w") as f:
        json.dump(
            dict(
                algo="ppo",
                env_id="Hopper-v5",
                seed=seed,
                completed=True,
                env_steps=steps,
                wall_seconds=steps / 1000,
                final_eval_return_mean=final,
                **({} if off_policy is None else dict(consumed_env_steps=steps, off_policy_env_steps=off_policy)),
            ),
            f,
        )


@pytest.mark.slow
def test_report_places_evaluations_on_the_grid_and_checks_the_control_against_the_peer_band(tmp_path, capsys):
    out = tmp_path / "control"
    for seed in range(5):
        _write_run(str(out / "sync-cleanrl" / f"Hopper-v5-s{seed}"), [10, 400 + seed], final=300 + seed, seed=seed)
    for seed in range(3):
        peer = [90 + 10 * seed, 190 + 10 * seed]
        _write_run(str(out / "sb3-cleanrl" / f"Hopper-v5-s{seed}"), peer, final=290 + 10 * seed, eval_env_steps=False)
        off_policy = [0, 3 * GRID // 4, 3 * GRID // 2][seed]  # of the 3 × GRID env steps trained on
        _write_run(
            str(out / "async-default" / f"Hopper-v5-s{seed}"), [10, 20], final=5000 + seed, seed=seed,
            off_policy=off_policy,
        )  # fmt: skip
    result = ppo_control.report(str(out))["Hopper-v5"]
    control = result["sync-cleanrl"]
    assert control["curve_env_steps"] == [GRID, 2 * GRID, 3 * GRID]
    assert control["curve_iqm"][0] == pytest.approx(10) and control["curve_iqm"][2] == pytest.approx(302)
    assert control["final_returns"] == [300, 301, 302, 303, 304] and control["final_median"] == 302
    # Each evaluation counts at its own env steps, not at the later row's: the first point is 100, not None.
    assert result["sb3-cleanrl"]["curve_iqm"][0] == pytest.approx(100)
    low, high = result["sb3-cleanrl"]["curve_ci95"][0]
    assert low <= 100 <= high
    # The control's curve: below the peer's band at the first point (10), above it at the second (402), inside at
    # the last (302 in the peer's 290-310).
    assert control["inside_peer_band"] == [1, 3]
    assert (control["below_peer_band"], control["above_peer_band"]) == (1, 1)
    assert "inside_peer_band" not in result["async-default"]
    # Against the control: every async-default run beats every control run, by about 16.6 times its IQM.
    against = result["async-default"]["against_control"]
    assert against["probability_of_improvement"] == [1.0, 1.0, 1.0]
    ratio, low, high = against["iqm_ratio"]
    assert ratio == pytest.approx(5001 / 302) and low <= ratio <= high
    assert against["iqm_difference"][0] == pytest.approx(4699)
    assert "against_control" not in control
    # Two peer runs are no band: the control is not held against one.
    shutil.rmtree(out / "sb3-cleanrl" / "Hopper-v5-s2")
    assert "inside_peer_band" not in ppo_control.report(str(out))["Hopper-v5"]["sync-cleanrl"]
    # Diagnostics: each run's latest row at or before each grid point, the median over runs.
    assert control["diagnostics"]["approx_kl"] == [(2 * GRID, pytest.approx(0.7)), (3 * GRID, pytest.approx(1.2))]
    assert result["async-default"]["env_steps_per_second_median"] == pytest.approx(1000)
    # The share of off-policy env steps: the median of its three runs' 0, ¼ and ½; none for runs whose summaries
    # count none (the control's, written here without the counts, and the peer's).
    assert result["async-default"]["off_policy_fraction_median"] == pytest.approx(0.25)
    assert control["off_policy_fraction_median"] is None and result["sb3-cleanrl"]["off_policy_fraction_median"] is None
    # Against another variant (--control): the ratios turn over, and only the synchronous control has a peer band.
    other = ppo_control.report(str(out), control="async-default")["Hopper-v5"]
    against = other["sync-cleanrl"]["against_control"]
    assert against["control"] == "async-default" and against["probability_of_improvement"] == [0.0, 0.0, 0.0]
    assert "against_control" not in other["async-default"] and "inside_peer_band" not in other["sync-cleanrl"]
    # A pair (--against) sets a variant against another beside the control; a pair with too few runs (the two
    # peer runs left) is left out.
    paired_names = [("sync-cleanrl", "async-default"), ("async-default", "sb3-cleanrl")]
    paired = ppo_control.report(str(out), pairs=paired_names)
    against = paired["Hopper-v5"]["sync-cleanrl"]["against"]["async-default"]
    assert against["probability_of_improvement"] == [0.0, 0.0, 0.0] and against["iqm_ratio"][0] < 0.1
    assert paired["Hopper-v5"]["async-default"]["against_control"] == result["async-default"]["against_control"]
    assert "against" not in paired["Hopper-v5"]["async-default"]
    left_out = ppo_control.report(str(out), pairs=[("sb3-cleanrl", "async-default")])["Hopper-v5"]["sb3-cleanrl"]
    assert "against" not in left_out  # too few runs on the first side
    # Kept to some envs and variants: a variant brings its control (and the control the peer beside it), a pair
    # brings both its sides, and an env not named leaves nothing.
    kept = ppo_control.report(str(out), variants=["async-default"])["Hopper-v5"]
    assert sorted(kept) == ["async-default", "sb3-cleanrl", "sync-cleanrl"]
    assert kept["async-default"]["against_control"] == result["async-default"]["against_control"]
    kept = ppo_control.report(str(out), control="async-default", variants=["sb3-cleanrl"], pairs=paired_names)
    assert sorted(kept["Hopper-v5"]) == ["async-default", "sb3-cleanrl", "sync-cleanrl"]
    alone = ppo_control.report(str(out), control="async-default", variants=["async-default"])["Hopper-v5"]
    assert sorted(alone) == ["async-default"]  # no peer beside a control other than the synchronous one
    assert ppo_control.report(str(out), envs=["Walker2d-v5"]) == {}
    # The printed report has the pair's line, and names the pair compared on no env.
    ppo_control.print_report(paired, paired_names)
    printed = capsys.readouterr().out
    assert "P(a run beats one of async-default) 0.00 [0.00, 0.00]" in printed
    assert "--against async-default=sb3-cleanrl: compared on no env" in printed
    assert "--against sync-cleanrl=async-default" not in printed


def test_report_says_what_it_found_nothing_of(tmp_path):
    out = tmp_path / "control"
    _write_run(str(out / "sync-cleanrl" / "Hopper-v5-s0"), [10, 20], final=30)
    cmd = [sys.executable, os.path.join(BENCHMARKS, "ppo_control.py"), "report"]

    def report(*args):
        return subprocess.run([*cmd, *args], capture_output=True, text=True)

    done = report(str(out), "--envs", "Hopper-v5", "Walker2d-v5", "--variants", "sync-cleanrl", "async-default")
    assert done.returncode == 0 and "sync-cleanrl" in done.stdout, done.stderr
    assert "no finished runs of Walker2d-v5, async-default (check the names)" in done.stderr
    done = report(str(out), "--envs", "Hoper-v5")
    assert (
        done.returncode == 1
        and "no finished runs in" in done.stderr
        and "VARIANT/ENV-sSEED" in done.stderr
        and not done.stdout
    )
    done = report("--records", str(tmp_path / "records"))
    assert done.returncode == 2 and "is not a folder" in done.stderr


def test_a_failed_run_stops_the_benchmark_with_what_to_do(tmp_path):
    out = tmp_path / "runs"
    cmd = [sys.executable, os.path.join(BENCHMARKS, "ppo_control.py"), "run", "--envs", "NoSuchEnv-v5", "--seeds", "0"]
    done = subprocess.run(
        [*cmd, "--total-steps", "1000", "--out", str(out), "--variants", "sync-cleanrl"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1 and "unknown or unavailable environment id 'NoSuchEnv-v5'" in done.stderr, done.stderr
    assert "the run failed (exit status 2" in done.stderr and "give the same command again" in done.stderr
    assert "Traceback" not in done.stderr, done.stderr


@pytest.mark.parametrize(
    "text, said",
    [
        ("sync-cleanrl", "is not VARIANT=OTHER"),
        ("=sync-cleanrl", "is not VARIANT=OTHER"),
        ("sync-cleanrl=async-defualt", "did you mean async-default"),
        ("sync-cleanrl=sync-cleanrl", "with itself"),
    ],
)
def test_against_refuses_what_is_not_a_pair_of_two_variants(text, said):
    with pytest.raises(argparse.ArgumentTypeError, match=said):
        ppo_control._pair(text)
    assert ppo_control._pair("sync-cleanrl=async-default") == ("sync-cleanrl", "async-default")


@pytest.mark.slow
def test_runs_compared_with_a_control_say_whether_a_difference_is_established():
    from report import compare_with_ci

    same = compare_with_ci([1000, 1100, 1200, 1300], [1050, 1150, 1250, 1000])
    p, low, high = same["probability_of_improvement"]
    assert low < 0.5 < high and same["iqm_difference"][1] < 0 < same["iqm_difference"][2]
    worse = compare_with_ci([100, 110, 120, 130], [1000, 1100, 1200, 1300])
    assert worse["probability_of_improvement"] == [0.0, 0.0, 0.0] and worse["iqm_ratio"][2] < 1
    # A control run at or below 0 leaves the ratio undefined; the difference and the probability still hold.
    signed = compare_with_ci([10, 20, 30], [-5, 5, 15])
    assert signed["iqm_ratio"] is None and signed["probability_of_improvement"][0] > 0.5


@pytest.mark.slow
def test_a_comparison_repeats_and_leaves_numpys_generator_alone():
    from report import compare_with_ci

    x, y = [2958, 1697, 2571, 644, 1182], [655, 654, 878, 843, 566]
    np.random.seed(123)
    expected_next = np.random.rand()
    np.random.seed(123)
    first = compare_with_ci(x, y)
    assert np.random.rand() == expected_next  # the caller's global generator is where it was
    assert compare_with_ci(x, y) == first  # the bootstrap CIs are the same every time


def test_the_sb3_peer_takes_the_cleanrl_preset(tmp_path):
    from rlfleet.algorithms.settings import make_algo_config

    c = make_algo_config("ppo", "cleanrl", "Hopper-v5", {})
    kw = sb3_peer.ppo_kwargs("Hopper-v5")
    assert kw["n_envs"] * kw["n_steps"] == c.batch_env_steps == 2048
    assert kw["batch_size"] == 2048 // c.num_minibatches and kw["n_epochs"] == c.epochs
    assert kw["learning_rate"](1.0) == pytest.approx(3e-4) and kw["learning_rate"](0.0) == 0.0
    assert kw["vec_normalize"] == dict(gamma=c.discount, clip_obs=10.0, clip_reward=10.0)
    # SB3's loss is policy + vf_coef × mean squared error; CleanRL's policy + 0.5 × (0.5 × mean squared error).
    assert (kw["clip_range_vf"], kw["vf_coef"], kw["max_grad_norm"]) == (0.2, 0.25, 0.5)
    assert sb3_peer.ppo_kwargs("Hopper-v5", 0, dict(value_clip=0.0))["clip_range_vf"] is None  # SB3's "no clip"
    one = sb3_peer.ppo_kwargs("Hopper-v5", 1)  # CleanRL's own layout: one env of 2048 steps
    assert (one["n_envs"], one["n_steps"], one["batch_size"]) == (1, 2048, 64)
    with pytest.raises(ValueError, match="does not divide"):
        sb3_peer.ppo_kwargs("Hopper-v5", 3)
    # VecNormalize on top of the cleanrl preset, which has it already, is refused before anything runs.
    cmd = [sys.executable, os.path.join(BENCHMARKS, "sb3_peer.py"), "--preset", "cleanrl", "--normalize", "obs"]
    done = subprocess.run(
        [*cmd, "--env", "Hopper-v5", "--total-steps", "10", "--logdir", str(tmp_path / "run")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "--normalize goes with PPO's defaults" in done.stderr, done.stderr
    assert not (tmp_path / "run").exists()


def test_the_peers_rollout_statistics_merge_to_what_per_step_updates_reach():
    """`--statistics rollout`: fixed statistics through a rollout, then the same statistics as SB3's VecNormalize."""
    pytest.importorskip("stable_baselines3", reason="the peer needs the bench extra: pip install -e '.[cpu,bench]'")
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    per_step = VecNormalize(make_vec_env("Pendulum-v1", n_envs=2, seed=3), gamma=0.9)
    per_rollout = sb3_peer.rollout_statistics_normalize(make_vec_env("Pendulum-v1", n_envs=2, seed=3), gamma=0.9)
    mean0, var0 = per_rollout.obs_rms.mean.copy(), per_rollout.obs_rms.var.copy()
    per_step.reset(), per_rollout.reset()
    actions = np.random.default_rng(0).uniform(-2, 2, size=(250, 2, 1)).astype(np.float32)
    episodes_ended = 0
    for a in actions:  # 250 steps: the envs' 200-step time limit resets them on the way
        obs, rewards, dones, _ = per_step.step(a)
        obs_r, rewards_r, dones_r, _ = per_rollout.step(a)
        np.testing.assert_array_equal(dones, dones_r)
        episodes_ended += int(dones.sum())
    assert episodes_ended == 2 and per_step.obs_rms.count == pytest.approx(251 * 2, abs=1e-3)
    np.testing.assert_array_equal(per_rollout.obs_rms.mean, mean0)  # held through the rollout
    np.testing.assert_array_equal(per_rollout.obs_rms.var, var0)
    raw = per_rollout.get_original_obs()
    np.testing.assert_allclose(obs_r, np.clip((raw - mean0) / np.sqrt(var0 + 1e-8), -10, 10), rtol=1e-6)
    assert not np.allclose(obs_r, obs)  # SB3's normalised with statistics that moved
    per_rollout.merge()
    for a, b in ((per_rollout.obs_rms, per_step.obs_rms), (per_rollout.ret_rms, per_step.ret_rms)):
        assert a.count == pytest.approx(b.count)
        np.testing.assert_allclose(a.mean, b.mean, rtol=1e-5)  # float32 observations
        np.testing.assert_allclose(a.var, b.var, rtol=1e-5)
    np.testing.assert_allclose(per_rollout.normalize_obs(raw), obs, atol=1e-5)
    per_rollout.merge()  # nothing kept since: the statistics stay
    assert per_rollout.obs_rms.count == pytest.approx(per_step.obs_rms.count)


def test_every_rlfleet_variant_resolves_to_valid_settings():
    """A misspelt or mistyped `--set` in a variant would only fail once its runs start: each variant's preset and
    overrides (parsed as `rlfleet up` parses them) must build a PPO config on every suite env, per-env overrides
    included, and the ablations the docs compare must differ in what they say they differ in."""
    import dataclasses

    import suite

    from rlfleet.algorithms.settings import make_algo_config
    from rlfleet.deploy.cli import _parse_overrides

    def resolve(name, env):
        algo, args = ppo_control.VARIANTS[name]
        assert len(args) % 2 == 0, f"{name}: a flag without its value in {args}"
        preset, sets = "default", []
        for flag, value in zip(args[::2], args[1::2]):
            assert flag in ("--config", "--set"), f"{name}: {flag} is not an rlfleet up option the variant may use"
            if flag == "--config":
                preset = value
            else:
                sets.append(value)
        return make_algo_config("ppo", preset, env, _parse_overrides(tuple(sets)))

    envs = sorted({env for algo, env in suite.TARGETS if algo == "ppo"})
    assert "Hopper-v5" in envs and "Ant-v5" in envs
    names = [name for name, (algo, _) in ppo_control.VARIANTS.items() if algo == "ppo"]
    for env in envs:
        for name in names:
            resolve(name, env)

    def differences(a, b, env="Hopper-v5"):
        x, y = dataclasses.asdict(resolve(a, env)), dataclasses.asdict(resolve(b, env))
        return {k for k in x if x[k] != y[k]}

    assert resolve("sync-cleanrl", "Hopper-v5").synchronous and not resolve("async-cleanrl", "Hopper-v5").synchronous
    assert differences("async-default-sb3norm", "async-default-sb3opt") == {"lr_schedule"}
    assert differences("async-default-sb3norm", "async-default-sb3norm-1env") == {"envs_per_actor"}
    assert differences("async-default-sb3norm-1env", "async-default-sb3-1env") == {"obs_normalization"}
    assert differences("sync-default-sb3-1env-obsnorm", "sync-default-sb3-1env") == {"obs_normalization", "obs_clip"}
    assert differences("sync-default-sb3-1env-returnscale", "sync-default-sb3-1env") == {"reward_scale"}
    for base in ("sync-default-sb3-1env", "sync-default-sb3-1env-obsnorm"):
        assert differences(f"{base}-annealed", base) == {"lr_schedule"}
        assert differences(f"{base}-defaultopt", base) == differences("async-default-sb3opt", "async-default")
    assert differences("sync-default-sb3-vf1-obsnorm", "sync-default-sb3-vf1") == {"obs_normalization", "obs_clip"}
    assert differences("sync-default-sb3-vf1-obsnorm", "sync-default-sb3-1env-obsnorm") == {"envs_per_actor"}
    for floor in ("25", "50"):
        assert differences(f"async-default-lrfloor{floor}", "async-default") == {"lr_final_fraction"}
    # The pairs set against each other on Ant-v5 (async ÷ sync under one change) differ in the collection mode alone.
    for change in ("", "-constant-lr", "-lrfloor25", "-1env", "-sb3-1env", "-sb3-1env-annealed"):
        assert differences(f"async-default{change}", f"sync-default{change}", "Ant-v5") == {"synchronous"}
    # With `default`'s optimisation, its rate and its layout back, SB3's settings are `default`'s again.
    assert differences("sync-default-sb3-1env-obsnorm-defaultopt", "sync-default") == {
        "lr_schedule",
        "envs_per_actor",
        "obs_clip",
    }
    assert differences("async-default-sb3opt", "async-default") == {
        "shared_optimizer",
        "adam_epsilon",
        "advantage_norm",
        "init",
        "value_loss_coef",
    }
    # Ant-v5's raw observations (its per-env override) hold under the ablations that do not set them.
    assert not resolve("async-default-sb3opt", "Ant-v5").obs_normalization


@pytest.mark.slow
def test_records_report_as_their_run_directories_and_are_not_run_again(tmp_path):
    """A run's record (summary, evaluations, diagnostics on the grid) gives the report its run directory gives, and
    `run --records` trains none of the runs recorded at its budget: a benchmark goes on from its records alone."""
    out, records = tmp_path / "runs", str(tmp_path / "records")
    for seed in range(3):
        _write_run(str(out / "sync-cleanrl" / f"Hopper-v5-s{seed}"), [10, 400 + seed, 400 + seed], final=30, seed=seed)
        peer = [90 + 10 * seed, 190 + 10 * seed, 250]
        _write_run(str(out / "sb3-cleanrl" / f"Hopper-v5-s{seed}"), peer, final=29 + seed, eval_env_steps=False)
    for d in sorted(out.glob("*/*")):
        ppo_control.keep_record(str(d), records, ["run", "..."])
    with open(os.path.join(records, "sync-cleanrl", "Hopper-v5-s1.json")) as f:
        saved = json.load(f)
    assert saved["run"] == "Hopper-v5-s1" and saved["command"] == ["run", "..."]
    # Only the rows the report reads: each evaluation's first row and each grid point's latest diagnostics.
    assert len(saved["rows"]) < 2 * 3 and {"eval_env_steps", "approx_kl"} <= set(saved["rows"][0])

    def without_paths(result):
        return {
            env: {v: {k: x for k, x in r.items() if k != "dirs"} for v, r in vs.items()} for env, vs in result.items()
        }

    from_dirs = ppo_control.report(str(out))
    assert from_dirs["Hopper-v5"]["sync-cleanrl"]["diagnostics"]["approx_kl"]
    assert without_paths(ppo_control.report(None, records=records)) == without_paths(from_dirs)
    # A run directory stands in for its own record; records fill in the runs whose directories are gone.
    shutil.rmtree(out / "sb3-cleanrl")
    assert without_paths(ppo_control.report(str(out), records=records)) == without_paths(from_dirs)

    # A run directory stopped short of its budget does not hide its finished record.
    stopped = out / "sync-cleanrl" / "Hopper-v5-s1" / "summary.json"
    stopped.write_text(json.dumps(dict(json.loads(stopped.read_text()), completed=False)))
    assert ppo_control.report(str(out), records=records)["Hopper-v5"]["sync-cleanrl"]["seeds"] == [0, 1, 2]
    # A damaged record is named, with what to do about it.
    damaged = os.path.join(records, "sync-cleanrl", "Hopper-v5-s2.json")
    with open(damaged) as f:
        text = f.read()
    with open(damaged, "w") as f:
        f.write(text[: len(text) // 2])
    with pytest.raises(ValueError, match="Hopper-v5-s2.json: not a readable run record .*delete it"):
        ppo_control.report(None, records=records)
    with open(damaged, "w") as f:
        f.write(text)

    budget = 4 * GRID  # each run's env steps (summary.json)
    assert ppo_control.recorded(records, str(out / "sb3-cleanrl" / "Hopper-v5-s0"), budget)
    assert not ppo_control.recorded(records, str(out / "sb3-cleanrl" / "Hopper-v5-s0"), budget + 1)
    assert not ppo_control.recorded(records, str(out / "sb3-cleanrl" / "Hopper-v5-s3"), budget)
    fresh = tmp_path / "fresh"
    cmd = [sys.executable, os.path.join(BENCHMARKS, "ppo_control.py"), "run", "--envs", "Hopper-v5"]
    cmd += ["--seeds", "0", "1", "2", "--variants", "sync-cleanrl", "sb3-cleanrl", "--total-steps", str(budget)]
    cmd += ["--out", str(fresh), "--records", records]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("finished earlier, kept in") == 6 and not fresh.exists()
    assert "IQM curve inside sb3-cleanrl's 95% band" in done.stdout


@pytest.mark.slow
def test_the_sb3_peer_normalises_with_its_own_vecnormalize(tmp_path):
    """`--normalize obs`: SB3's defaults on a VecNormalize'd env, evaluated with the training statistics."""
    pytest.importorskip("stable_baselines3", reason="the peer needs the bench extra: pip install -e '.[cpu,bench]'")
    logdir = tmp_path / "run"
    cmd = [sys.executable, os.path.join(BENCHMARKS, "sb3_peer.py"), "--normalize", "obs", "--env", "Pendulum-v1"]
    cmd += ["--total-steps", "2048", "--eval-every", "1024", "--eval-episodes", "1", "--logdir", str(logdir)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((logdir / "summary.json").read_text())
    assert summary["completed"] and summary["env_steps"] == 2048 and summary["algo"] == "sb3-ppo"
    assert "VecNormalize(norm_obs=True, norm_reward=False)" in summary["config"]
    rows = [json.loads(line) for line in (logdir / "metrics.jsonl").read_text().splitlines()]
    assert [r["env_steps"] for r in rows if "eval_return_mean" in r] == [1024, 2048, 2048]
