"""`rlfleet import-teacher`: a teacher folder from a Q-network trained outside rlfleet and its data
(`rlfleet.algorithms.qdagger.outside` describes the folder and the three data sources).

Everything is checked before anything is written (the model against the env, the data's env and spaces); the
folder is written beside its final place and renamed into it whole.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import types

import numpy as np

from rlfleet.actors.adders import Act, Step, WindowAdder
from rlfleet.algorithms.dqn.agent import evaluate_q
from rlfleet.algorithms.dqn.items import TABLE, dqn_signature, envs_per_item
from rlfleet.algorithms.dqn.policy import epsilon_greedy_q
from rlfleet.algorithms.library.evaluation import STOP, EvaluationInterrupted
from rlfleet.algorithms.qdagger.errors import TeacherError
from rlfleet.algorithms.qdagger.outside import (
    EVAL_EPSILON,
    IMPORTED,
    MINARI_PREFIX,
    ONNX_FILE,
    SAVEDMODEL_DIR,
    load_model,
)
from rlfleet.algorithms.qdagger.teacher import items_n_step, read_run_record, teacher_algos
from rlfleet.common.files import atomic_write, fsync_path
from rlfleet.common.logs import logger
from rlfleet.common.progress_line import ProgressLine
from rlfleet.envs import gym_id
from rlfleet.envs.core import env_seeds, env_spec, is_atari, make_batched_env, policy_observations
from rlfleet.replay.checkpoints import REPLAY_SUBDIR, checkpoint_replay, usable_checkpoint

log = logger("qdagger")

GENERATE_ENVS = 8  # envs stepped as one batch while the teacher generates its data


def _check_stop() -> None:
    """Raises `EvaluationInterrupted` once the command is stopping (SIGINT/SIGTERM set evaluation's `STOP`): the
    import ends and leaves nothing."""
    if STOP.is_set():
        raise EvaluationInterrupted("import-teacher stopped")


class _LocalWriter:
    """What the actors' `WindowAdder` needs of an actor, for writing into a replay server of this process: its
    items of `envs_per_item` envs each go to `TABLE`, and every write waits for the server (nothing samples this
    table)."""

    def __init__(self, address: str, num_envs: int, envs_per_item: int):
        self.replay_address = address
        self.config = types.SimpleNamespace(envs_per_item=envs_per_item, table=TABLE, num_envs=num_envs)

    def wait_written(self, writer, epoch: int, in_flight: int = 1) -> bool:
        writer.flush(block_until_num_items=in_flight)
        return True


def write_replay(root: str, spec, n_step: int, capacity: int, num_envs: int, feed, envs_per_item: int = 1) -> int:
    """Writes a Reverb checkpoint of DQN items (`dqn_signature`, `envs_per_item` envs each) into `root` (a
    teacher's `replay/`): `feed(adder)` hands the steps of `num_envs` streams of episodes to the actors' writer
    (`start`, then `add` per batch step) and returns how many batch steps it gave; each stream's last step must
    end its episode (terminated or cut). Returns the transitions written (one per env and batch step)."""
    import reverb

    from rlfleet.replay.checkpoints import checkpointer

    g = envs_per_item
    table = reverb.Table(
        name=TABLE,
        sampler=reverb.selectors.Uniform(),
        remover=reverb.selectors.Fifo(),
        max_size=max(-(-capacity // g), 1),
        rate_limiter=reverb.rate_limiters.MinSize(1),
        signature=dqn_signature(spec.frame_shape, np.dtype(spec.obs_dtype), n_step, spec.frame_stack, g),
    )
    server = reverb.Server(tables=[table], checkpointer=checkpointer(root))
    try:
        address = f"localhost:{server.port}"
        writer = _LocalWriter(address, num_envs, g)
        adder = WindowAdder(writer, 0, n_step + spec.frame_stack, spec.frame_stack, 32)
        try:
            steps = feed(adder)
            # n padding steps after every stream's last (ended) step complete the windows of its last n
            # transitions: one item per transition written. A window reaching past the episode's end is masked
            # (`transitions`): a terminal one ends there, a cut one is never trained on.
            zeros = np.zeros((num_envs, *spec.obs_shape), np.dtype(spec.obs_dtype))
            no, cut = np.zeros(num_envs, bool), np.ones(num_envs, bool)
            act = Act(np.zeros(num_envs, np.int32), np.zeros(num_envs, np.int32), {})
            for _ in range(n_step):
                adder.add(Step(zeros, act, np.zeros(num_envs, np.float32), no, cut, {}, zeros), -1, 0)
            for writer in adder.writers:
                writer.flush()
        finally:
            adder.close()
        checkpoint_replay(address, root=root)
    finally:
        server.stop()
    return steps * num_envs


def generate(q, spec, steps: int, seed: int, epsilon: tuple[float, float]):
    """A `write_replay` feed: the teacher `q` (`ModelQ`) acts ε-greedily in `GENERATE_ENVS` envs for `steps`
    transitions in all, ε linear from epsilon[0] to epsilon[1] over them (CleanRL's QDagger scripts fill the
    teacher's replay so when none is kept; Agarwal et al. 2022, Fig. A.19)."""

    def feed(adder) -> int:
        n = GENERATE_ENVS
        venv = make_batched_env(spec.env_id, n, "ale" if is_atari(spec.env_id) else "sync")
        rng = np.random.default_rng(seed)
        try:
            obs = policy_observations(venv.reset(seed=env_seeds(seed, n))[0])
            adder.start(obs)
            batch_steps = -(-steps // n)
            line = ProgressLine("teacher acting", "env steps")
            for t in range(batch_steps):
                _check_stop()
                line.update(t * n, batch_steps * n)
                eps = epsilon[0] + (epsilon[1] - epsilon[0]) * t / max(batch_steps - 1, 1)
                action = epsilon_greedy_q(q.numpy(obs), rng, eps)
                next_obs, reward, terminated, truncated, info = venv.step(action)
                next_obs = policy_observations(next_obs)
                if t == batch_steps - 1:  # the data ends here: every episode still running is cut
                    truncated = np.ones_like(truncated, bool)
                adder.add(Step(obs, Act(action, action, {}), reward, terminated, truncated, info, next_obs), 0, t)
                obs = next_obs
            return batch_steps
        finally:
            venv.close()

    return feed


def minari_dataset(ref: str, spec):
    """The Minari dataset `ref` ("minari:DATASET_ID", stored locally: Minari's `MINARI_DATASETS_PATH`, else
    ~/.minari/datasets), checked against the env `spec`.

    Raises:
        TeacherError: minari not installed, no such dataset, or a dataset of another env, observation shape or
            action count.
    """
    dataset_id = ref[len(MINARI_PREFIX) :]
    try:
        import minari
    except ImportError as e:
        raise TeacherError(f'--data {ref} needs Minari ({e}): pip install -e ".[cpu,minari]".') from None
    if not dataset_id:
        raise TeacherError(f"--data {ref}: no dataset id after {MINARI_PREFIX} (e.g. minari:D4RL/door/human-v2).")
    try:
        dataset = minari.load_dataset(dataset_id)
    except FileNotFoundError:
        raise TeacherError(
            f"--data {ref}: no Minari dataset {dataset_id!r} is stored here; download it first (`minari download "
            f"{dataset_id}`) or set MINARI_DATASETS_PATH to the folder that holds it."
        ) from None
    except Exception as e:  # Minari's other errors: a malformed id, unreadable files
        raise TeacherError(f"--data {ref}: Minari cannot load {dataset_id!r}: {str(e)[:300]}") from None
    env = getattr(dataset.env_spec, "id", None)
    if env is not None and env != gym_id(spec.env_id):
        raise TeacherError(f"--data {ref}: a dataset of {env}, not of {spec.env_id}; give a dataset of the same env.")
    if not dataset.total_steps:
        raise TeacherError(f"--data {ref}: the dataset holds no steps; give one with the teacher's transitions.")
    obs_shape = tuple(getattr(dataset.observation_space, "shape", None) or ())
    actions = getattr(dataset.action_space, "n", None)
    if obs_shape != tuple(spec.obs_shape) or actions is None or int(actions) != spec.action_dim:
        raise TeacherError(
            f"--data {ref}: its observations {dataset.observation_space} and actions {dataset.action_space} are "
            f"not {spec.env_id}'s (observations of shape {list(spec.obs_shape)}, {spec.action_dim} discrete "
            "actions); give a dataset of the same env."
        )
    return dataset


def minari_feed(dataset):
    """A `write_replay` feed of every episode of a Minari dataset, one after another in one stream (an episode
    that ends neither terminated nor truncated, cut where the dataset stopped recording, counts as truncated)."""

    def feed(adder) -> int:
        steps, started = 0, False
        for episode in dataset.iterate_episodes():
            _check_stop()
            if len(episode.actions) == 0:
                continue
            obs = policy_observations(np.asarray(episode.observations))
            actions = np.asarray(episode.actions, np.int64)
            rewards = np.asarray(episode.rewards, np.float32)
            terminated = np.asarray(episode.terminations, bool)
            truncated = np.asarray(episode.truncations, bool).copy()
            truncated[-1] |= not terminated[-1]
            if not started:
                adder.start(obs[:1])
                started = True
            for t in range(len(actions)):
                a = actions[t : t + 1]
                step = Step(obs[t : t + 1], Act(a, a, {}), rewards[t : t + 1], terminated[t : t + 1],
                            truncated[t : t + 1], {}, obs[t + 1 : t + 2])  # fmt: skip
                adder.add(step, 0, steps)
                steps += 1
        return steps

    return feed


def run_replay(run_dir: str, spec) -> tuple[str, int]:
    """(the newest readable replay checkpoint of the rlfleet run `run_dir`, its items' n_step).

    Raises:
        TeacherError: not a run of a DQN-style algorithm on the same env, or no readable replay checkpoint.
    """

    run = read_run_record(run_dir, "--data", "give an rlfleet run directory, or minari:DATASET_ID")
    teachers = [*teacher_algos(), IMPORTED]
    if run.get("env_id") != spec.env_id:
        raise TeacherError(f"--data {run_dir}: a run on {run.get('env_id')}; give a run on {spec.env_id}.")
    if run.get("algo") not in teachers:
        raise TeacherError(
            f"--data {run_dir}: a {run.get('algo')} run, which keeps no replay a teacher's data can come from; give "
            f"a run of {', '.join(teacher_algos())} or a teacher folder of `rlfleet import-teacher`."
        )
    checkpoint, skipped, _ = usable_checkpoint(os.path.join(run_dir, REPLAY_SUBDIR))
    if checkpoint is None:
        raise TeacherError(f"--data {run_dir}: no readable replay checkpoint ({'; '.join(skipped) or 'none'}).")
    return checkpoint, items_n_step(run, spec)


def _staging(out: str) -> str:
    if os.path.exists(out) and not (os.path.isdir(out) and not os.listdir(out)):
        raise TeacherError(f"--out {out} already exists; give a new folder (nothing in it was touched).")
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    staging = os.path.join(parent, f".rlfleet-teacher-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    os.mkdir(staging)
    return staging


@dataclasses.dataclass(frozen=True)
class ImportSettings:
    """Where an imported teacher's data comes from, and how it is written and evaluated.

    Attributes:
        data: an rlfleet run directory (its replay checkpoint), or "minari:DATASET_ID"; None: generate it.
        generate_steps: transitions the teacher generates by acting (with `data` None; 0 otherwise).
        epsilon: (first, last) ε of the generating teacher's ε-greedy actions, linear over the steps.
        n_step: the items' n (None: the student algorithm's default for the env, or the run directory's own); a
            student reads them with the same n_step.
        seed: env seeds of the generating envs start here, of the evaluation `GENERATE_ENVS` above.
        eval_episodes: episodes of the teacher's evaluation (summary.json; 0: none).
    """

    data: str | None = None
    generate_steps: int = 0
    epsilon: tuple[float, float] = (1.0, 0.01)
    n_step: int | None = None
    seed: int = 0
    eval_episodes: int = 10


def import_teacher(model: str, env_id: str, out: str, settings: ImportSettings, algo: str = "qdagger") -> dict:
    """Writes the teacher folder `out` (`rlfleet.algorithms.qdagger.outside`) from the Q-network `model` and the
    data `settings` names, for students of `algo` (its default n_step for the env is the items' unless
    `settings` gives one). Returns the folder's run.json record.

    Raises:
        TeacherError: a bad model, data or combination of them (nothing is written then).
        rlfleet.envs.core.EnvError: an unknown env id.
        EvaluationInterrupted: `rlfleet.algorithms.library.evaluation.STOP` was set (nothing is left).
    """
    from rlfleet.algorithms.settings import make_algo_config

    spec = env_spec(env_id)
    if spec.action_kind != "discrete":
        raise TeacherError(f"--env {env_id}: its actions are continuous; a Q-network teacher needs discrete ones.")
    if bool(settings.data) == bool(settings.generate_steps):
        raise TeacherError(
            "give the teacher's data as --data (an rlfleet run directory, or minari:DATASET_ID) or have the "
            "teacher generate it with --generate-steps N: one of the two."
        )
    if make_algo_config(algo, "default", env_id).guide_roll_in_steps:
        raise TeacherError(
            f"--algo {algo}: its teacher acts on the actors (guide_roll_in_steps), which run only rlfleet's own "
            "Q-networks, so a model file cannot be its teacher; give it an rlfleet DQN run as --teacher, or import "
            "for a method that uses the teacher on the learner (qdagger, kickstarting, pretrain_finetune, "
            "rehearsal, dqfd)."
        )
    q = load_model(model, spec)
    source = _data_source(settings, spec, algo)
    staging = _staging(out)
    try:
        fmt = _copy_model(q, staging)
        data = source(q, os.path.join(staging, REPLAY_SUBDIR))
        first, episodes = settings.seed + GENERATE_ENVS, settings.eval_episodes  # past the generating envs' seeds
        returns = evaluate_q(q.numpy, env_id, episodes, first, EVAL_EPSILON, "teacher evaluation") if episodes else []
        record = dict(
            kind="teacher",  # not a run (rlfleet.learner.run_dir.TEACHER_KIND): eval, export and resume refuse it
            algo=IMPORTED,
            env_id=env_id,
            model=dict(format=fmt, file=ONNX_FILE if fmt == "onnx" else SAVEDMODEL_DIR, source=os.path.abspath(model)),
            data=data,
            config=dict(n_step=data.pop("n_step")),
        )
        _finish(staging, out, record, returns)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return record


def _data_source(settings: ImportSettings, spec, algo: str):
    """Checks the data `settings` names against `spec` and returns what writes it: `write(q, root)` -> the
    record of the data (with the items' "n_step").

    Raises:
        TeacherError: see `minari_dataset` and `run_replay`; an --n-step that differs from a run's items.
    """
    from rlfleet.algorithms.settings import make_algo_config

    data, n_step = settings.data, settings.n_step
    if data and not data.startswith(MINARI_PREFIX):
        checkpoint, run_n = run_replay(data, spec)
        if n_step is not None and n_step != run_n:
            raise TeacherError(f"--data {data}: its items are {run_n}-step; --n-step {n_step} cannot change that.")

        def copy(q, root):
            shutil.copytree(checkpoint, os.path.join(root, os.path.basename(checkpoint)), copy_function=_link)
            return dict(run=os.path.abspath(data), checkpoint=os.path.basename(checkpoint), n_step=run_n)

        return copy
    config = make_algo_config(algo, "default", spec.env_id)
    n_step = n_step or config.n_step
    if data:
        dataset = minari_dataset(data, spec)

        def from_minari(q, root):
            written = write_replay(root, spec, n_step, int(dataset.total_steps), 1, minari_feed(dataset))
            return dict(minari=data[len(MINARI_PREFIX) :], episodes=int(dataset.total_episodes),
                        transitions=written, n_step=n_step)  # fmt: skip

        return from_minari
    steps, seed, epsilon = settings.generate_steps, settings.seed, settings.epsilon

    def generated(q, root):
        # Items of several envs each, as an actor of the student's settings would write (cheaper to read).
        g = envs_per_item(GENERATE_ENVS, config.batch_size)
        feed = generate(q, spec, steps, seed, epsilon)
        written = write_replay(root, spec, n_step, steps + GENERATE_ENVS, GENERATE_ENVS, feed, g)
        return dict(generated_by_teacher=written, epsilon=list(epsilon), seed=seed, n_step=n_step)

    return generated


def _link(src: str, dst: str) -> None:
    """A hard link of `src` at `dst` where the file system allows (replay checkpoints are large), else a copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _copy_model(q, staging: str) -> str:
    if q.fmt == "onnx":
        shutil.copyfile(q.path, os.path.join(staging, ONNX_FILE))
    else:
        shutil.copytree(q.path, os.path.join(staging, SAVEDMODEL_DIR))
    return q.fmt


def _finish(staging: str, out: str, record: dict, returns: list[float]) -> None:
    """run.json and summary.json into the staging folder, everything synced, then renamed to `out`."""
    summary = dict(algo=IMPORTED, env_id=record["env_id"], final_eval_episodes=len(returns))
    summary["final_eval_return_mean"] = float(np.mean(returns)) if returns else None
    atomic_write(os.path.join(staging, "summary.json"), json.dumps(summary, indent=2))
    atomic_write(os.path.join(staging, "run.json"), json.dumps(record, indent=2))
    for folder, _, files in os.walk(staging, topdown=False):
        for name in files:
            fsync_path(os.path.join(folder, name))
        fsync_path(folder)
    if os.path.isdir(out):
        os.rmdir(out)
    os.rename(staging, out)
    fsync_path(os.path.dirname(os.path.abspath(out)))
