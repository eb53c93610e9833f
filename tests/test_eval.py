"""After a run: `rlfleet eval RUN`, a finished run's policy evaluated again in a fresh process, from its latest,
best or a numbered checkpoint, with videos of its episodes; `rlfleet export RUN`, the policy as a SavedModel or
ONNX model that a process without rlfleet runs; bad input refused with the reason."""

import json
import os
import shutil

import numpy as np
import pytest
from helpers import rlfleet, run_exported

from rlfleet.envs.video import read_video

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pendulum_run(tmp_path_factory):
    """A short PPO run on InvertedPendulum-v5 with an evaluation every 2 policy versions, in a folder whose name
    TensorFlow, Reverb and FFmpeg would read as a pattern or a protocol."""
    logdir = tmp_path_factory.mktemp("eval") / "run:1 [a]*? ü"
    out = rlfleet(
        "up",
        "--algo",
        "ppo",
        "--env",
        "InvertedPendulum-v5",
        "--total-steps",
        30000,
        "--seed",
        4,
        "--logdir",
        logdir,
        "--set",
        "eval_every_updates=2",
        "--set",
        "eval_episodes=3",
        "--video-every",
        3,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return logdir


def test_up_video_every_records_evaluation_episodes(pendulum_run):
    """`up --video-every 3`: the learner renders an evaluation episode after every third evaluation into
    RUN/videos and TensorBoard, while it trains."""
    import re

    import tensorflow as tf

    videos = sorted((pendulum_run / "videos").glob("env-steps-*.mp4"))
    assert videos, os.listdir(pendulum_run)
    assert not list((pendulum_run / "videos").glob(".*"))  # no partial file left
    log = (pendulum_run / "logs" / "learner.log").read_text()
    said = {
        int(steps.replace(",", "")): int(length)
        for steps, length in re.findall(
            r"video of an evaluation episode at env steps ([\d,]+) \(return [-\d.,]+, (\d+) env", log
        )
    }
    assert len(said) == len(videos), log[-3000:]
    for path in videos:
        frames, _ = read_video(str(path))
        steps = int(path.stem.split("-")[-1])
        assert frames.shape[0] == said[steps] + 1 and frames.std(axis=0).max() > 0
    # TensorBoard: one animated GIF per video under the tag eval/video, at the video's env steps.
    images = []
    for events in (pendulum_run / "tb" / "videos").glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(events)):
            images += [(event.step, v.image) for v in event.summary.value if v.tag == "eval/video"]
    assert sorted(step for step, _ in images) == sorted(said)
    assert all(image.encoded_image_string[:6] == b"GIF89a" and image.width == 160 for _, image in images)


def _eval_cli(*args, expect=0):
    out = rlfleet(*args, timeout=600)
    assert out.returncode == expect, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def _eval(*args, expect=0):
    return _eval_cli("eval", *args, expect=expect)


def test_the_best_checkpoint_scores_again_what_its_evaluation_scored(pendulum_run, tmp_path):
    summary = json.loads((pendulum_run / "summary.json").read_text())
    result = tmp_path / "best.json"
    out = _eval(pendulum_run, "--checkpoint", "best", "--json", result)
    got = json.loads(result.read_text())
    # Same network, same evaluation policy, same env seeds as the learner's evaluation: the same returns.
    assert got["return_mean"] == pytest.approx(summary["best_eval_return_mean"], abs=1e-6), (got, summary)
    assert got["env_steps"] == summary["best_eval_env_steps"]
    assert got["episodes"] == 3 and len(got["returns"]) == len(got["lengths"]) == 3
    assert got["checkpoint"] == summary["best_checkpoint"]
    assert got["return_std"] == pytest.approx(np.std(got["returns"]))
    assert "return mean" in out.stdout and "the run's evaluation of this checkpoint" in out.stdout


def test_latest_numbered_seeded_and_stochastic(pendulum_run, tmp_path):
    summary = json.loads((pendulum_run / "summary.json").read_text())
    latest = tmp_path / "latest.json"
    _eval(pendulum_run, "--episodes", 2, "--seed", 7, "--json", latest)
    got = json.loads(latest.read_text())
    # The last checkpoint is written just before summary.json, whose count can only have grown since.
    assert summary["total_steps"] <= got["env_steps"] <= summary["env_steps"]
    assert got["first_seed"] == 7 and got["episodes"] == 2
    assert got["policy"] == "evaluation"
    # The latest checkpoint by its number gives the same network, so the same returns.
    number = os.path.basename(got["checkpoint"]).split("-")[1]
    again = tmp_path / "numbered.json"
    _eval(pendulum_run, "--checkpoint", number, "--episodes", 2, "--seed", 7, "--json", again)
    assert json.loads(again.read_text())["returns"] == got["returns"]
    # The behaviour policy samples its actions: seeded, so one seed gives one result.
    s1, s2 = tmp_path / "s1.json", tmp_path / "s2.json"
    for path in (s1, s2):
        _eval(pendulum_run, "--stochastic", "--episodes", 2, "--seed", 7, "--json", path)
    first, second = json.loads(s1.read_text()), json.loads(s2.read_text())
    assert first["policy"] == "stochastic" and first["returns"] == second["returns"]


def test_bad_input_names_the_problem(pendulum_run, tmp_path):
    out = _eval(pendulum_run, "--checkpoint", 999, expect=2)
    assert "no checkpoint ckpt-999" in out.stderr and "it holds checkpoints" in out.stderr
    assert "--checkpoint best" in out.stderr
    out = _eval(pendulum_run, "--json", tmp_path / "missing" / "e.json", expect=2)
    assert "does not exist or cannot be written" in out.stderr and "rlfleet eval:" not in out.stdout
    out = _eval(pendulum_run, "--checkpoint", "newest", expect=2)
    assert "give latest, best or a checkpoint number" in out.stderr
    out = _eval(tmp_path / "nowhere", expect=2)
    assert "no such directory" in out.stderr
    (tmp_path / "empty").mkdir()
    out = _eval(tmp_path / "empty", expect=2)
    assert "no run.json" in out.stderr
    # A copy of the run without its best checkpoint: best is refused, latest still works.
    copy = tmp_path / "copy"
    shutil.copytree(pendulum_run, copy)
    shutil.rmtree(copy / "checkpoints" / "best")
    out = _eval(copy, "--checkpoint", "best", expect=2)
    assert "no best checkpoint" in out.stderr and "--checkpoint latest" in out.stderr
    _eval(copy, "--episodes", 1)


def test_video_of_each_episode(pendulum_run, tmp_path):
    videos, result = tmp_path / "videos", tmp_path / "video.json"
    out = _eval(pendulum_run, "--episodes", 2, "--seed", 11, "--video", videos, "--json", result)
    got = json.loads(result.read_text())
    assert sorted(os.listdir(videos)) == sorted(os.path.basename(v) for v in got["videos"]), out.stdout
    assert len(got["videos"]) == 2
    for path, length in zip(got["videos"], got["lengths"]):
        frames, fps = read_video(path)
        # One frame after the reset and one after every env step, at the env's real-time rate.
        assert frames.shape[0] == length + 1 and frames.shape[-1] == 3, (frames.shape, length)
        assert fps > 0
        assert frames.std(axis=0).max() > 0, "every frame is the same"
    # Rendering changes nothing the policy sees: the episodes score as without a video.
    plain = tmp_path / "plain.json"
    _eval(pendulum_run, "--episodes", 2, "--seed", 11, "--json", plain)
    assert json.loads(plain.read_text())["returns"] == got["returns"]


def actor_actions(run, observations: np.ndarray) -> np.ndarray:
    """The actions the run's latest policy takes in the actors' own numpy code (the evaluation policy)."""
    from rlfleet.learner.restored import restore_run

    return restore_run(str(run)).agent.policy(False, 0)(observations)


@pytest.mark.parametrize("fmt", ["savedmodel", "onnx"])
def test_export_reproduces_the_actors_actions(pendulum_run, tmp_path, fmt):
    out = tmp_path / "policy [x]*? ü"
    done = _eval_cli("export", pendulum_run, "--out", out, "--format", fmt)
    assert "input  observations: float32 [None, 4]" in done.stdout, done.stdout
    spec = json.loads((out / "policy.json").read_text())
    assert spec["format"] == fmt and spec["action"]["kind"] == "continuous" and spec["observation"]["shape"] == [4]
    assert spec["outputs"]["actions"]["shape"] == [None, 1]
    rng = np.random.default_rng(0)
    # 1,000 observations, some far outside what the normalizer has seen (its clip acts).
    obs = (rng.standard_normal((1000, 4)) * np.r_[1.0, 1.0, 10.0, 10.0]).astype(np.float32)
    if fmt == "savedmodel":  # TensorFlow's loader reads such a path as a pattern: the user is told, and links it
        assert "tf.saved_model.load will not find" in done.stderr, done.stderr
        os.symlink(out, tmp_path / "policy")
    model = str(out / "policy.onnx") if fmt == "onnx" else str(tmp_path / "policy")
    got = run_exported(tmp_path, fmt, model, obs)["actions"]
    want = actor_actions(pendulum_run, obs)
    assert got.shape == want.shape == (1000, 1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert np.all(got >= -3.0) and np.all(got <= 3.0) and np.ptp(got) > 0  # InvertedPendulum's bounds: ±3


def test_export_refuses_a_used_folder(pendulum_run, tmp_path):
    used = tmp_path / "used"
    used.mkdir()
    (used / "keep.txt").write_text("mine")
    done = _eval_cli("export", pendulum_run, "--out", used, expect=2)
    assert "already exists" in done.stderr and (used / "keep.txt").read_text() == "mine"
    assert os.listdir(tmp_path) == ["used"]  # nothing half-written beside it
