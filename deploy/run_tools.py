"""The commands used after a run, on its run directory alone: `rlfleet eval` (and its videos), `rlfleet export`,
`rlfleet report` (seeds compared)."""

from __future__ import annotations

import math
import os
import sys

import click
import numpy as np

from rlfleet.deploy.cli_common import Path, env_timeout_option, fail, quiet_tf

SPEC_NAME = "policy.json"  # rlfleet.learner.export.SPEC_FILE, named here without importing TensorFlow
EXIT_STOPPED = 130  # eval stopped by SIGTERM/SIGINT: nothing partial is left


def _checkpoint_option(f):
    return click.option(
        "--checkpoint",
        "choice",
        default="latest",
        show_default=True,
        metavar="latest|best|N",
        help="Which checkpoint: the newest (latest), the one of the run's best evaluation (best, "
        "RUN/checkpoints/best) or RUN/checkpoints/ckpt-N (N).",
    )(f)


def _restore(run_dir: str, choice: str):
    """The run's policy from the chosen checkpoint (`rlfleet.learner.restored.restore_run`); exits 2 with the
    reason when it cannot be restored."""
    quiet_tf()
    from rlfleet.learner.restored import RestoreError, parse_checkpoint_choice, restore_run

    try:
        which = parse_checkpoint_choice(choice)
    except ValueError as e:
        fail(str(e))
    try:
        return restore_run(run_dir, which)
    except RestoreError as e:
        fail(str(e))


def _checkpoint_tag(restored) -> str:
    """A file-name tag for the restored checkpoint: ckpt-N, or best-ckpt-N."""
    name = os.path.basename(restored.checkpoint)
    return f"best-{name}" if restored.best is not None else name


def summarize(returns: list[float]) -> dict:
    """mean, std (population), min and max of `returns` (floats; NaN for none)."""
    r = np.asarray(returns, np.float64)
    if r.size == 0:
        return dict(mean=math.nan, std=math.nan, min=math.nan, max=math.nan)
    return dict(mean=float(r.mean()), std=float(r.std()), min=float(r.min()), max=float(r.max()))


@click.command("eval")
@click.argument("run_dir", metavar="RUN", type=Path(file_okay=False))
@_checkpoint_option
@click.option(
    "--episodes",
    type=click.IntRange(1),
    default=None,
    help="Evaluation episodes (default: the run's eval_episodes setting).",
)
@click.option(
    "--seed",
    type=click.IntRange(0, 2**31 - 1),
    default=None,
    help="Env seed of the first episode (episode i: + i). Default: the seeds of the run's own evaluations, so "
    "that the best checkpoint scores again what its evaluation scored.",
)
@click.option(
    "--stochastic",
    is_flag=True,
    help="Act with the behaviour policy the actors ran (PPO: a sample of the Gaussian; DQN: ε-greedy with the "
    "checkpoint's exploration ε) instead of the evaluation policy (PPO: the mean action; DQN: greedy, ε = "
    "epsilon_eval).",
)
@click.option(
    "--video",
    "video_dir",
    type=Path(file_okay=False),
    default=None,
    help="Write one MP4 per episode into this folder (created), named by checkpoint and seed. MuJoCo renders "
    "offscreen through EGL (MUJOCO_GL=egl unless set; docs: After a run).",
)
@click.option("--json", "json_path", type=Path(dir_okay=False), default=None, help="Also write the result here.")
@env_timeout_option
def eval_cmd(run_dir, choice, episodes, seed, stochastic, video_dir, json_path, env_timeout_s):
    """Evaluate a run's policy again, in this process (no replay server, no learner).

    RUN is a run directory (`up --logdir`). Prints the return's mean, std, min and max over the episodes and the
    checkpoint's env steps; the env and its observation normalization are the run's, as of that checkpoint.
    """
    if video_dir:
        from rlfleet.envs.video import use_offscreen_rendering

        use_offscreen_rendering()  # before anything imports MuJoCo
    if json_path:  # checked before the episodes, not after them
        folder = os.path.dirname(os.path.abspath(json_path))
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            fail(f"--json {json_path}: its folder {folder} does not exist or cannot be written; give another path.")
    restored = _restore(run_dir, choice)
    from rlfleet.algorithms.library import evaluation
    from rlfleet.envs.core import EnvError
    from rlfleet.envs.video import VideoError
    from rlfleet.envs.watch import EnvHang

    agent = restored.agent
    episodes = episodes or agent.config.eval_episodes
    first_seed = evaluation.evaluation_seed(restored.seed) if seed is None else seed
    try:
        act = agent.policy(stochastic, first_seed)
    except NotImplementedError as e:
        fail(str(e))
    video_paths = _video_paths(video_dir, restored, stochastic, first_seed, episodes) if video_dir else None
    policy_words = "behaviour policy (stochastic)" if stochastic else "evaluation policy"
    click.echo(
        f"rlfleet eval: {restored.algo} on {restored.env_id}, checkpoint {restored.checkpoint} (env steps "
        f"{restored.env_steps:,}, policy version {restored.policy_version}); {episodes} episode(s), {policy_words}, "
        f"env seeds from {first_seed}"
    )
    from rlfleet.common.stopping import on_stop_signals

    on_stop_signals(evaluation.STOP.set)
    evaluation.WATCH["timeout_s"] = env_timeout_s
    try:
        result = evaluation.evaluate_policy(
            restored.env_id, act, episodes, first_seed, agent.evaluation_batched, video_paths
        )
    except evaluation.EvaluationInterrupted:
        click.echo("rlfleet eval: stopped; no result (and no partial video) was written.", err=True)
        sys.exit(EXIT_STOPPED)
    except (VideoError, EnvError, EnvHang) as e:  # EnvError: the env cannot be made or returned NaN/inf
        fail(str(e))
    stats = summarize(result.returns)
    _print_eval(restored, result, stats)
    if json_path:
        _write_eval_json(json_path, restored, stochastic, first_seed, result, stats)
        click.echo(f"result: {json_path}")


def _video_paths(video_dir: str, restored, stochastic: bool, first_seed: int, episodes: int) -> list[str]:
    """One MP4 path in `video_dir` (made here) for each episode, named by checkpoint, policy and env seed; exits 2
    when the folder cannot be made."""
    try:
        os.makedirs(video_dir, exist_ok=True)
    except OSError as e:
        fail(f"--video {video_dir}: cannot create the folder ({e.strerror}).")
    tag = f"{_checkpoint_tag(restored)}{'-stochastic' if stochastic else ''}"
    return [os.path.join(video_dir, f"{tag}-seed{first_seed + i}.mp4") for i in range(episodes)]


def _print_eval(restored, result, stats: dict) -> None:
    """The result `rlfleet eval` prints: the return's statistics, the run's own evaluation of the checkpoint, the
    videos."""
    click.echo(
        f"return mean {stats['mean']:,.2f}  std {stats['std']:,.2f}  min {stats['min']:,.2f}  "
        f"max {stats['max']:,.2f}  over {len(result.returns)} episode(s); length mean "
        f"{np.mean(result.lengths):,.1f} env steps"
    )
    if restored.best is not None:
        click.echo(
            f"the run's evaluation of this checkpoint: {restored.best['eval_return_mean']:,.2f} at env steps "
            f"{restored.best['eval_env_steps']:,}"
        )
    for path in result.videos:
        click.echo(f"video: {path}")


def _write_eval_json(path: str, restored, stochastic: bool, first_seed: int, result, stats: dict) -> None:
    """The evaluation's result as JSON at `path`, written atomically; exits 2 when it cannot be written."""
    from rlfleet.common.files import StorageError
    from rlfleet.learner.run_dir import write_json

    record = dict(
        run=os.path.abspath(restored.run_dir),
        algo=restored.algo,
        env_id=restored.env_id,
        checkpoint=os.path.abspath(restored.checkpoint),
        env_steps=restored.env_steps,
        policy_version=restored.policy_version,
        learner_steps=restored.learner_steps,
        policy="stochastic" if stochastic else "evaluation",
        first_seed=first_seed,
        episodes=len(result.returns),
        returns=result.returns,
        lengths=result.lengths,
        videos=[os.path.abspath(v) for v in result.videos],
        **{f"return_{k}": v for k, v in stats.items()},
    )
    try:
        write_json(path, record)
    except StorageError as e:
        fail(f"--json {path}: {e}")


@click.command("export")
@click.argument("run_dir", metavar="RUN", type=Path(file_okay=False))
@click.option("--out", "out", required=True, type=Path(), help="The folder to write (new, or empty).")
@_checkpoint_option
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["savedmodel", "onnx"]),
    default="savedmodel",
    show_default=True,
    help="A TensorFlow SavedModel (OUT itself), or OUT/policy.onnx (needs the export extra: tf2onnx).",
)
def export_cmd(run_dir, out, choice, fmt):
    """Export a run's policy as a standalone model: raw observations in, env actions out.

    The observation normalization, its clip and the action scaling (PPO: the mean action on the env's bounds;
    DQN: the greedy action, and the Q-values as a second output) are inside the model; OUT/policy.json describes
    the spaces and the signature (docs: After a run).
    """
    restored = _restore(run_dir, choice)
    from rlfleet.common.files import StorageError
    from rlfleet.learner.export import ExportError, export_policy

    try:
        record = export_policy(restored, out, fmt)
    except (ExportError, StorageError) as e:
        fail(str(e))
    click.echo(
        f"rlfleet export: {restored.algo} on {restored.env_id}, checkpoint {restored.checkpoint} (env steps "
        f"{restored.env_steps:,}) -> {out} ({fmt}; {SPEC_NAME} describes it)"
    )
    for name, tensor in record["inputs"].items():
        click.echo(f"  input  {name}: {tensor['dtype']} {tensor['shape']}")
    for name, tensor in record["outputs"].items():
        click.echo(f"  output {name}: {tensor['dtype']} {tensor['shape']}")
    from rlfleet.common.files import GLOB_CHARACTERS

    odd = "".join(sorted(GLOB_CHARACTERS & set(os.path.abspath(out))))
    if fmt == "savedmodel" and odd:
        click.echo(
            f"rlfleet export: warning: the path {out} holds {odd}, which TensorFlow reads as a file-name pattern: "
            "tf.saved_model.load will not find the model's variables there. Move the folder, or load it through "
            "a link whose path holds none of them.",
            err=True,
        )


@click.command("report")
@click.argument("paths", metavar="RUN_OR_FOLDER...", nargs=-1, required=True, type=Path(file_okay=False))
@click.option(
    "--plot",
    "plot_path",
    type=Path(dir_okay=False),
    default=None,
    help="Write the learning curves (IQM over seeds, 95% CI bands) here as a PNG (default: learning-curves.png "
    "in the first folder given).",
)
@click.option("--json", "json_path", type=Path(dir_okay=False), default=None, help="Also write the report here.")
def report_cmd(paths, plot_path, json_path):
    """Compare seeds: per-seed final and best returns, median and IQM with 95% CIs, and learning curves.

    Each RUN_OR_FOLDER is a run directory or a folder of them (`rlfleet up --seeds ... --logdir FOLDER`); runs
    are grouped by what they ran (algorithm, env, preset and settings). IQMs, CIs and the plot need the report
    extra (rliable, matplotlib). IQM and CIs: rliable's stratified bootstrap (Agarwal et al. 2021).
    """
    from rlfleet.analysis.runs_report import format_seeds_report, plot_seeds_report, seeds_report

    try:
        report = seeds_report(list(paths))
    except ValueError as e:
        fail(str(e))
    click.echo(format_seeds_report(report))
    if json_path:
        from rlfleet.common.files import StorageError
        from rlfleet.learner.run_dir import write_json

        try:
            write_json(json_path, dict(groups=report))
        except StorageError as e:
            fail(f"--json {json_path}: {e}")
        click.echo(f"report: {json_path}")
    if not any(g["curve"] for g in report):
        if any(g["finished"] >= 2 for g in report):
            from rlfleet.deploy.seeds import NO_CURVE

            click.echo(f"rlfleet report: no learning curves: {NO_CURVE}", err=True)
        return
    plot_path = plot_path or os.path.join(paths[0], "learning-curves.png")
    try:
        plot_seeds_report(report, plot_path)
    except ImportError as e:
        click.echo(f'rlfleet report: no plot: it needs matplotlib ({e}); pip install -e ".[cpu,report]"', err=True)
        return
    except OSError as e:
        fail(f"--plot {plot_path}: {e.strerror or e}")
    click.echo(f"learning curves: {plot_path}")
