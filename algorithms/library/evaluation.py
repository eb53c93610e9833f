"""Evaluation episodes for the learner: the episode loops every algorithm's evaluation runs its policy in
(`Agent.evaluate`), their seeds, and the stop that interrupts them."""

from __future__ import annotations

import dataclasses
import os
import threading
from typing import Callable, Sequence

import numpy as np

from rlfleet.common.logs import logger
from rlfleet.envs.core import (
    EnvError,
    env_seeds,
    env_spec,
    make_batched_env,
    make_env,
    make_rendering_env,
    policy_observations,
    resolve_backend,
)
from rlfleet.envs.watch import ENV_TIMEOUT_S, EnvWatch, watched

log = logger("evaluation")

# Set by the learner on SIGTERM/SIGINT: an evaluation in progress ends within one env step (it raises
# EvaluationInterrupted), so a stop is as prompt during an evaluation as between gradient steps.
STOP = threading.Event()


# Set by the process that evaluates (the learner, `rlfleet eval`): seconds each env call of an evaluation may take
# (`--env-timeout`; 0: no limit) and what runs before the process ends because one did not stop when interrupted
# (the learner checkpoints there); see `rlfleet.envs.watch.EnvWatch`.
WATCH = {"timeout_s": ENV_TIMEOUT_S, "on_stuck": None}


def _watch(env_id: str, describe) -> EnvWatch:
    """An `EnvWatch` of `env_id`'s calls with `WATCH`'s settings; `describe` as `EnvWatch` takes it."""
    return EnvWatch(env_id, WATCH["timeout_s"], describe, WATCH["on_stuck"])


def check_finite(env_id: str, obs: np.ndarray, reward, where: str) -> None:
    """Raises EnvError when `obs` (observations [..., *obs_shape]) or `reward` (a scalar or [B]; None: not
    checked) holds a NaN or inf: the env's fault, said with `where` it returned them (e.g. "in its reset,
    episode seed 7")."""
    bad_obs = obs.dtype.kind == "f" and not np.isfinite(obs).all()
    if bad_obs or (reward is not None and not np.isfinite(reward).all()):
        raise EnvError(
            f"{env_id} returned a non-finite {'observation' if bad_obs else 'reward'} {where}; fix the env (or its "
            "wrappers)"
        )


class EvaluationInterrupted(Exception):
    """The learner is stopping (`STOP` is set): the evaluation in progress was abandoned, no return counts."""


def evaluation_seed(run_seed: int) -> int:
    """The env seed of the first episode of every evaluation of a run seeded `run_seed` (episode i: + i).

    Offset by 10**6 from the run seed, away from the seeds the actors' envs start from; the same seeds each
    time, so a network evaluated again (e.g. a teacher restored from its checkpoint) scores the same.
    """
    return run_seed + 10**6


# The most env steps an evaluation episode may take when its env has no time limit of its own (an env registered
# without `max_episode_steps`): longer ones are cut there, their partial return counted, and the evaluation says
# so. An env with a limit ends its episodes at that limit as it always does.
MAX_EPISODE_STEPS = 100_000


def episode_step_cap(env) -> int:
    """The env steps an evaluation episode of `env` may take: its time limit, else `MAX_EPISODE_STEPS`."""
    limit = env.spec.max_episode_steps if getattr(env, "spec", None) is not None else None
    return limit or MAX_EPISODE_STEPS


def _say_cut(env_id: str, cut: int, episodes: int, cap: int) -> None:
    """Warns that `cut` of `episodes` evaluation episodes of `env_id` were cut at `cap` env steps (none: silent)."""
    if cut:
        log.warning(
            "%s: %d of %d evaluation episodes cut at %d env steps: the env has no time limit of its own (register "
            "it with max_episode_steps, or wrap it in gymnasium's TimeLimit, to end its episodes where it should).",
            env_id,
            cut,
            episodes,
            cap,
        )


def _check_stop() -> None:
    if STOP.is_set():
        raise EvaluationInterrupted()


@dataclasses.dataclass
class Episodes:
    """Evaluation episodes, in episode order: undiscounted returns, lengths in env steps, and the video of each
    episode recorded (paths; empty without videos)."""

    returns: list[float]
    lengths: list[int]
    videos: list[str] = dataclasses.field(default_factory=list)


def run_episodes(
    env_id: str,
    episodes: int,
    seed: int,
    act: Callable[[np.ndarray], np.ndarray],
    video_paths: Sequence[str] | None = None,
) -> Episodes:
    """Runs `episodes` full episodes one after another in one env (env seeds `seed`, `seed` + 1, ...).

    Args:
        act: the policy, observations [B, *obs_shape] -> env actions [B, ...] (called with B = 1).
        video_paths: one .mp4 path per episode: each episode is rendered (`make_rendering_env`) and written there
            (`rlfleet.envs.video.VideoWriter`) at the env's real-time frame rate, from the first observation's
            frame to the last.
    Raises:
        EvaluationInterrupted: `STOP` was set (checked before every env step).
        rlfleet.envs.video.VideoError: a frame could not be rendered or a video not written.
        EnvError: the env cannot be made, or returned a NaN/inf observation or reward.
        rlfleet.envs.watch.EnvHang: an env call took longer than `WATCH`'s limit.
    """
    episode_seed = [env_seeds(seed, 1)[0]]
    with _watch(env_id, lambda: f"episode seed {episode_seed[0]}") as watch:
        watch.begin("construction")
        try:
            env = make_rendering_env(env_id) if video_paths else make_env(env_id)
        finally:
            watch.end()
        env = watched(env, watch)
        try:
            return _run_episodes(env, env_id, episodes, seed, act, video_paths, episode_seed)
        finally:
            env.close()


def _run_episodes(env, env_id, episodes, seed, act, video_paths, episode_seed: list) -> Episodes:
    """`run_episodes` in the env `env` it made; `episode_seed[0]` is set to each episode's seed as it starts."""
    result = Episodes([], [])
    cap, cut = episode_step_cap(env), 0
    for i in range(episodes):
        episode_seed[0] = env_seeds(seed + i, 1)[0]
        path = video_paths[i] if video_paths else ""
        total, length, ended, path = _episode(env, env_id, episode_seed[0], act, cap, path)
        result.videos += [path] if path else []
        cut += not ended
        result.returns.append(total)
        result.lengths.append(length)
    _say_cut(env_id, cut, episodes, cap)
    return result


def _episode(env, env_id: str, episode_seed: int, act, cap: int, video_path: str) -> tuple[float, int, bool, str]:
    """One episode of `act` in `env` on `episode_seed`, cut at `cap` env steps, rendered into `video_path` ("":
    none). Returns its return, its length, whether the env ended it (False: the cap did) and the video's path
    ("" without one)."""
    from rlfleet.envs import video

    obs, _ = env.reset(seed=episode_seed)
    check_finite(env_id, _one(obs), None, f"in its reset (episode seed {episode_seed})")
    writer = video.VideoWriter(video_path, env.metadata.get("render_fps") or 30) if video_path else None
    total, length, done, ended = 0.0, 0, False, False
    try:
        if writer:
            _add_frame(env, env_id, writer)
        while not done:
            _check_stop()
            obs, reward, terminated, truncated, _ = env.step(act(_one(obs))[0])
            check_finite(env_id, _one(obs), reward, f"in its step {length + 1} (episode seed {episode_seed})")
            total, length = total + float(reward), length + 1
            ended = bool(terminated or truncated)
            done = ended or length >= cap
            if writer:
                _add_frame(env, env_id, writer)
        return total, length, ended, writer.close() if writer else ""
    except BaseException:
        if writer:
            writer.discard()
        raise


def _one(obs) -> np.ndarray:
    """One env's observation as a batch of one, [1, *obs_shape], as policies take it (`policy_observations`)."""
    return policy_observations(obs)[None]


def _add_frame(env, env_id: str, writer) -> None:
    """Renders the env's current frame into `writer`."""
    from rlfleet.envs.video import VideoError, rendering_error

    try:
        frame = env.render()
    except Exception as e:  # OpenGL, EGL and MuJoCo raise their own classes
        writer.discard()
        raise rendering_error(env_id, e) from None
    if frame is None:
        writer.discard()
        raise VideoError(f"{env_id}: the env rendered no frame (its render_mode is not rgb_array).")
    writer.add(frame)


def run_batched_episodes(
    env_id: str,
    episodes: int,
    seed: int,
    act: Callable[[np.ndarray], np.ndarray],
    max_steps: int | None = None,
    progress: str | None = None,
) -> Episodes:
    """Runs one episode in each of `episodes` envs stepped as one batch (Atari: ale-py, else in-process).

    `act` maps observations [B, ...] to actions [B]. Episodes still running
    after `max_steps` batch steps (None: the env's time limit, else `MAX_EPISODE_STEPS`) are cut (their partial
    return counts), which a warning says.
    `progress` names the evaluation in progress lines (`rlfleet.common.progress_line`) printed every few seconds
    while it runs: episodes ended, env steps and their rate, and once an episode has ended, the time left
    estimated from the mean length of those that ended (each running episode taken to last at least that long,
    and longer than it has).
    Returns the undiscounted return and the length of each episode, env order.
    Raises:
        EvaluationInterrupted: `STOP` was set (checked before every batch step).
        EnvError: the env returned a NaN/inf observation or reward.
        rlfleet.envs.watch.EnvHang: an env call took longer than `WATCH`'s limit.
    """
    from rlfleet.common.progress_line import ProgressLine

    line = ProgressLine(progress, "env steps") if progress else None
    backend = resolve_backend(env_id, "auto")
    cap = max_steps or env_spec(env_id).max_episode_steps or MAX_EPISODE_STEPS
    with _watch(env_id, lambda: f"{episodes} envs, seeds from {seed}") as watch:
        watch.begin("construction")
        try:
            venv = make_batched_env(env_id, episodes, backend if backend == "ale" else "sync")
        finally:
            watch.end()
        venv = watched(venv, watch)
        try:
            obs, _ = venv.reset(seed=env_seeds(seed, episodes))
            obs = policy_observations(obs)  # as the policy takes them (a float64 beyond float32's range: not finite)
            check_finite(env_id, obs, None, f"in its reset (env seeds from {seed})")
            totals = np.zeros(episodes)
            lengths = np.zeros(episodes, np.int64)
            running = np.ones(episodes, bool)
            for step in range(cap):
                _check_stop()
                obs, reward, terminated, truncated, _ = venv.step(act(obs))
                obs = policy_observations(obs)
                check_finite(env_id, obs[running], reward[running], f"in its step {step + 1} (env seeds from {seed})")
                totals += np.where(running, reward, 0.0)
                lengths += running
                running &= ~(terminated | truncated)
                if not running.any():
                    break
                if line:
                    _show_progress(line, lengths, running)
        finally:
            venv.close()
    _say_cut(env_id, int(running.sum()), episodes, cap)
    return Episodes(totals.tolist(), lengths.tolist())


def _show_progress(line, lengths: np.ndarray, running: np.ndarray) -> None:
    """Updates a batched evaluation's progress line: env steps so far and, once an episode has ended, the total
    expected (each running episode taken to last as long as those that ended, and longer than it has)."""
    ended = ~running
    total = None
    if ended.any():
        expect = max(float(lengths[ended].mean()), float(lengths[running].max()) + 1)
        total = float(lengths[ended].sum()) + expect * int(running.sum())
    line.update(float(lengths.sum()), total, f"{int(ended.sum())}/{len(lengths)} episodes ended")


def evaluate_policy(
    env_id: str,
    act: Callable[[np.ndarray], np.ndarray],
    episodes: int,
    seed: int,
    batched: bool,
    video_paths: Sequence[str] | None = None,
) -> Episodes:
    """Evaluation episodes of the policy `act` (observations [B, *obs_shape] -> env actions [B, ...]) with episode
    seeds `seed` + i: all at once in a batch of envs (`run_batched_episodes`) when `batched`, else one after
    another (`run_episodes`); always one after another, rendered, with `video_paths`.

    Raises:
        EvaluationInterrupted, VideoError, EnvError: see `run_episodes`.
    """
    if batched and not video_paths:
        return run_batched_episodes(env_id, episodes, seed, act)
    return run_episodes(env_id, episodes, seed, act, video_paths)


class EvaluationVideos:
    """The learner's videos (`--video-every N`): after every N-th evaluation, one more episode of the evaluated
    policy is played and rendered, on a thread of its own so that training goes on meanwhile, into
    RUN/videos/env-steps-<env steps>.mp4 and into TensorBoard (RUN/tb/videos, tag `eval/video`: an animated GIF,
    as TensorBoard's image dashboard shows them). One video at a time: an evaluation due while the previous
    video still renders gets none. A video that cannot be made is reported once and turns videos off; it never
    stops the run.

    Args:
        logdir: the run directory.
        env_id: the env to render.
        every: record after every `every`-th evaluation of this process (0: never).
    """

    def __init__(self, logdir: str, env_id: str, every: int):
        self.folder, self.env_id, self.every = os.path.join(logdir, "videos"), env_id, every
        self._tb_dir = os.path.join(logdir, "tb", "videos")
        self.evaluations = 0
        self.thread = None
        for name in os.listdir(self.folder) if every and os.path.isdir(self.folder) else []:
            if name.startswith(".") and name.endswith(".partial"):  # a video an earlier process did not finish
                os.remove(os.path.join(self.folder, name))

    def after_evaluation(self, policy, seed: int, env_steps: int) -> None:
        """Counts one evaluation; when a video is due, starts recording one episode of `policy` (observations
        [B, ...] -> actions [B, ...], a snapshot of the evaluated weights) on env seed `seed`."""
        self.evaluations += 1
        if not self.every or self.evaluations % self.every:
            return
        if self.thread is not None and self.thread.is_alive():
            log.info("no video at env steps %s: the previous one is still rendering", f"{env_steps:,}")
            return
        self.thread = threading.Thread(
            target=self._record, args=(policy, seed, env_steps), name="evaluation-video", daemon=True
        )
        self.thread.start()

    def _record(self, policy, seed: int, env_steps: int) -> None:
        from rlfleet.envs.core import EnvError
        from rlfleet.envs.video import VideoError

        path = os.path.join(self.folder, f"env-steps-{env_steps:09d}.mp4")
        try:
            os.makedirs(self.folder, exist_ok=True)
            episode = run_episodes(self.env_id, 1, seed, policy, [path])
            self._to_tensorboard(path, env_steps)
        except EvaluationInterrupted:
            return
        except Exception as e:  # VideoError, EnvError, OSError, and whatever rendering or encoding raised
            self.every = 0
            words = str(e) if isinstance(e, (VideoError, EnvError)) else f"{type(e).__name__}: {e}"
            log.warning("no more videos this run: %s", words)
            return
        log.info(
            "video of an evaluation episode at env steps %s (return %s, %d env steps): %s",
            f"{env_steps:,}",
            f"{episode.returns[0]:,.1f}",
            episode.lengths[0],
            path,
        )

    def _to_tensorboard(self, path: str, env_steps: int) -> None:
        import tensorflow as tf
        from tensorboard.compat.proto import summary_pb2

        from rlfleet.envs.video import gif_of_video

        data, height, width = gif_of_video(path)
        image = summary_pb2.Summary.Image(height=height, width=width, colorspace=3, encoded_image_string=data)
        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag="eval/video", image=image)])
        writer = tf.summary.create_file_writer(self._tb_dir)
        with writer.as_default():
            tf.summary.experimental.write_raw_pb(summary.SerializeToString(), step=env_steps)
        writer.close()

    def close(self, timeout: float | None = None) -> None:
        """Waits (up to `timeout` seconds; None: for good) for a video being recorded to be written, or, with the
        evaluation stop set (`STOP`), abandoned."""
        if self.thread is not None:
            self.thread.join(timeout)
