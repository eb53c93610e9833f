"""Environment specs and batched environments for actors and evaluation.

An actor steps its envs as one batch on one of several backends, all with the
same interface (`make_batched_env`): "sync" (every env in the actor process,
gymnasium's `SyncVectorEnv`: best where a step costs less than a process round
trip), "workers" (a few worker processes of several envs each,
`rlfleet.envs.workers`: for envs expensive enough that processes pay),
"envpool" (envpool's C++ threads, for the envs it has), "async" (one process
per env, gymnasium's `AsyncVectorEnv` with observations in shared memory: the
layout of BatchPPO, Hafner et al. 2017, Sec. 2) and "ale" (Atari). "auto", the
default, is chosen by measurement on each actor
(`rlfleet.actors.backend_choice`). Every backend resets a finished episode in
the same step and hands its last observation over in the step's info
(`truncation_observations`).

Atari ids (`ALE/Game-v5`) always use ale-py's C++ `AtariVectorEnv` (backend
"ale") with the preprocessing of the Reincarnating RL / Dopamine setup: sticky
actions 0.25, frame skip 4 with max-pool over the last two frames, 84x84
grayscale, a stack of the last 4 frames, no noop or fire resets, episodes cut at
108k frames. Rewards come back unclipped (episode returns stay the game
score); the learner clips them for its TD targets.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.metadata
import json
import logging
import re
import traceback

import gymnasium as gym
import numpy as np
from ale_py.vector_env import AtariVectorEnv

from rlfleet.envs import ENV_BACKENDS, ENV_KWARGS_MARK, gym_id
from rlfleet.envs.workers import WorkerVectorEnv

BACKENDS = ENV_BACKENDS
# Open files a batch of envs holds per env in the process that steps it, by backend: `async` a pipe and a process
# handle for each env's process (with margin); the others a few in all.
OPEN_FILES_PER_ENV = {"async": 4}
DEFAULT_BACKEND = "auto"  # ale for Atari; else the fastest measured on the actor (rlfleet.actors.backend_choice)

# Atari preprocessing (Dopamine / reincarnating_rl Atari settings).
ATARI = dict(
    repeat_action_probability=0.25,
    frameskip=4,
    maxpool=True,
    img_height=84,
    img_width=84,
    grayscale=True,
    stack_num=4,
    noop_max=0,
    use_fire_reset=False,
    episodic_life=False,
    reward_clipping=False,
    max_num_frames_per_episode=108_000,
)


SEED_LIMIT = 2**31  # env seeds are taken modulo this: ALE and envpool accept only seeds in [0, 2**31)


def env_seeds(first: int, count: int) -> list[int]:
    """Seeds of `count` envs or episodes from `first` on (first + i), each folded into [0, SEED_LIMIT) so that
    every backend takes it, whatever run seed and offsets (actor ids, restarts, evaluations) made `first`."""
    return [(first + i) % SEED_LIMIT for i in range(count)]


class EnvError(ValueError):
    """An environment id or its spaces cannot be used for the requested algorithm."""


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """What the learner, the replay tables and the actors must agree on.

    Attributes:
        env_id: gymnasium id, e.g. "HalfCheetah-v5".
        obs_shape: observation shape (float32 after conversion).
        action_kind: "continuous" (Box) or "discrete".
        action_dim: Box: number of action dimensions; discrete: number of actions.
        action_low / action_high: Box bounds (float32 [action_dim]); empty for discrete.
        max_episode_steps: time limit of the registered env (None if unlimited).
        frame_stack: observations stack this many frames on axis 0 (Atari: 4;
            obs_shape = (4, 84, 84)); 1 for vector observations.
        obs_dtype: numpy dtype name of observations as stored in replay
            ("float32" for vectors, "uint8" for Atari frames).
    """

    env_id: str
    obs_shape: tuple
    action_kind: str
    action_dim: int
    action_low: tuple = ()
    action_high: tuple = ()
    max_episode_steps: int | None = None
    frame_stack: int = 1
    obs_dtype: str = "float32"

    @property
    def frame_shape(self) -> tuple:
        """Shape of one stored frame: obs_shape without the stack axis (obs_shape when frame_stack is 1)."""
        return self.obs_shape[1:] if self.frame_stack > 1 else self.obs_shape


def env_with_kwargs(env_id: str, kwargs: dict | None) -> str:
    """The env id every process makes the env from, carrying the constructor arguments `kwargs` (`--env-kwargs`)
    as JSON with sorted keys: `Corridor-v0?{"length":12}`; `env_id` itself when there are none. One string, so
    that the learner, the actors (through RunConfig), evaluation, run.json and settings.json hold the same ones,
    and a resumed run with other arguments is refused as a run on another env.

    Raises:
        EnvError: a value JSON cannot hold, or `env_id` already carries arguments.
    """
    if not kwargs:
        return env_id
    if ENV_KWARGS_MARK in env_id:
        raise EnvError(f"{env_id}: give its constructor arguments once, with --env-kwargs.")
    try:
        return env_id + ENV_KWARGS_MARK + json.dumps(kwargs, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise EnvError(f"--env-kwargs {kwargs}: {e}; give numbers, strings, booleans or lists.") from None


def split_env_id(env_id: str) -> tuple[str, dict]:
    """(the gymnasium id, its constructor arguments) of an id from `env_with_kwargs`.

    Raises:
        EnvError: arguments that do not parse.
    """
    base = gym_id(env_id)
    if base == env_id:
        return env_id, {}
    text = env_id[len(base) + len(ENV_KWARGS_MARK) :]
    try:
        kwargs = json.loads(text)
    except ValueError:
        kwargs = None
    if not isinstance(kwargs, dict):
        raise EnvError(f"{env_id}: the constructor arguments after {ENV_KWARGS_MARK!r} are not a JSON object.")
    return base, kwargs


def is_atari(env_id: str) -> bool:
    """True for ale-py ids such as "ALE/Pong-v5"."""
    return env_id.startswith("ALE/")


def atari_game(env_id: str) -> str:
    """ale-py ROM name of an Atari id: "ALE/SpaceInvaders-v5" -> "space_invaders".

    Raises:
        EnvError: not an `ALE/<Game>-v5` id, or a game whose ROM ale-py does not ship.
    """
    m = re.fullmatch(r"ALE/([A-Za-z0-9]+)-v5", env_id)
    if not m:
        raise EnvError(f"unsupported Atari id {env_id!r}; use the form ALE/<Game>-v5, e.g. ALE/Pong-v5.")
    game = re.sub(r"(?<!^)(?=[A-Z])", "_", m.group(1)).lower()
    import ale_py.roms

    if game not in ale_py.roms.get_all_rom_ids():
        raise EnvError(
            f"unknown Atari game in {env_id!r}: ale-py has no ROM {game!r}; "
            "see ale_py.roms.get_all_rom_ids() for the games it ships."
        )
    return game


def _atari_spec(env_id: str) -> EnvSpec:
    venv = make_atari_env(env_id, 1)
    try:
        return EnvSpec(
            env_id,
            tuple(venv.single_observation_space.shape),
            "discrete",
            int(venv.single_action_space.n),
            max_episode_steps=ATARI["max_num_frames_per_episode"] // 4,
            frame_stack=ATARI["stack_num"],
            obs_dtype="uint8",
        )
    finally:
        venv.close()


def make_atari_env(env_id: str, num_envs: int, num_threads: int = 0, batch_size: int = 0) -> gym.vector.VectorEnv:
    """ale-py's C++ `AtariVectorEnv` for `env_id` with the `ATARI` preprocessing and SAME_STEP autoreset.
    With 0 < `batch_size` < `num_envs` it is asynchronous: `send(actions)` / `recv()` step `batch_size` envs at
    a time (whichever are ready; `info["env_id"]` names them) while the others keep stepping.

    Shapes/dtypes: obs uint8 [B, 4, 84, 84] (oldest frame first; at an episode
    start the 3 older frames are zeros), reward float32 [B] (unclipped),
    terminated / truncated bool [B]; actions int [B] in the game's minimal action set.
    Raises:
        EnvError: see `atari_game`.
    """
    return _AtariVectorEnv(
        atari_game(env_id),
        num_envs,
        num_threads=num_threads,
        batch_size=batch_size,
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
        **ATARI,
    )


def make_rendering_env(env_id: str) -> gym.Env:
    """One env of `env_id` whose `render()` returns the current RGB frame, uint8 [H, W, 3], for videos.

    Vector envs: `make_env` with render_mode "rgb_array" (MuJoCo renders offscreen through the OpenGL backend
    that MUJOCO_GL names, see `rlfleet.envs.video.use_offscreen_rendering`). Atari ids: ale-py's single
    `AtariEnv` with gymnasium's `AtariPreprocessing` and a zero-padded 4-frame stack, set to the `ATARI`
    preprocessing, so that the policy sees what it saw in training (the same frames for the same emulator
    states as `make_atari_env`, obs uint8 [4, 84, 84]; its sticky actions draw from another random stream), while
    `render()` gives the full-colour screen [210, 160, 3].

    Raises:
        EnvError: unknown id; for Atari also opencv missing (gymnasium's preprocessing resizes with it).
    """
    if not is_atari(env_id):
        env = make_env(env_id, render_mode="rgb_array")
        _follow_with_track_camera(env)
        return env
    import ale_py

    gym.register_envs(ale_py)
    atari_game(env_id)  # EnvError for an id ale-py cannot play
    env = gym.make(
        env_id,
        frameskip=1,
        repeat_action_probability=ATARI["repeat_action_probability"],
        full_action_space=False,
        max_num_frames_per_episode=ATARI["max_num_frames_per_episode"],
        render_mode="rgb_array",
    )
    try:
        env = gym.wrappers.AtariPreprocessing(
            env,
            noop_max=ATARI["noop_max"],
            frame_skip=ATARI["frameskip"],
            screen_size=(ATARI["img_width"], ATARI["img_height"]),
            terminal_on_life_loss=ATARI["episodic_life"],
            grayscale_obs=ATARI["grayscale"],
            scale_obs=False,
        )
    except gym.error.DependencyNotInstalled as e:
        env.close()
        raise EnvError(f"{env_id}: an Atari video needs opencv ({e}); pip install opencv-python-headless.") from None
    return gym.wrappers.FrameStackObservation(env, ATARI["stack_num"], padding_type="zero")


def _follow_with_track_camera(env: gym.Env) -> None:
    """Renders a MuJoCo env through its model's camera named "track" where it has one (gymnasium's locomotion
    models: a camera that follows the body's centre of mass), instead of the free camera gymnasium falls back on,
    which some envs (HalfCheetah-v5) do not point at the body: it runs out of the picture."""
    renderer = getattr(env.unwrapped, "mujoco_renderer", None)
    model = getattr(env.unwrapped, "model", None)
    if renderer is None or model is None:
        return
    import mujoco

    camera = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, "track")
    if camera >= 0:
        renderer.camera_id = camera


class _AtariVectorEnv(AtariVectorEnv):
    """`AtariVectorEnv` that also takes a list of per-env seeds, like gymnasium's vector envs."""

    def reset(self, *, seed=None, options=None):
        if isinstance(seed, (list, tuple)):
            seed = np.asarray(seed, np.int64)
        return super().reset(seed=seed, options=options)


_MUJOCO_DEPRECATED_SETTOTALMASS = "compiler attribute 'settotalmass' is deprecated"


def quiet_settotalmass_warning() -> None:
    """Drops MuJoCo's "compiler attribute 'settotalmass' is deprecated" warning, and only that one.

    gymnasium's HalfCheetah XML still sets `settotalmass`; MuJoCo 4 warns
    about it each time the model is loaded (every env start, in every actor
    and evaluation), which tells a user nothing they can act on. Every other
    MuJoCo warning is logged as a warning. Safe to call more than once.
    """
    try:
        import mujoco
    except ImportError:
        return

    def handler(message: str) -> None:
        if _MUJOCO_DEPRECATED_SETTOTALMASS not in message:
            logging.getLogger("mujoco").warning("%s", message)  # MuJoCo's own: in the log, not on `up`'s terminal

    mujoco.set_mju_user_warning(handler)


def _missing_module(base: str, e: ModuleNotFoundError) -> str:
    """The message of an env whose registering module is not installed on this machine."""
    module = base.split(":", 1)[0] if ":" in base else (e.name or base)
    return (
        f"{base}: the module {module!r} that registers this env cannot be imported on this machine ({e}). "
        "Install the package that provides it on every machine of the cluster (the learner's, the replay "
        "server's and each actor's), e.g. pip install it into the same environment as rlfleet."
    )


def make_env(env_id: str, render_mode: str | None = None) -> gym.Env:
    """One gymnasium env (`gym.make`), with MuJoCo's settotalmass warning dropped; `render_mode` "rgb_array"
    makes `render()` return the current frame.

    Raises:
        EnvError: unknown or unavailable id (the message says which ids work).
    """
    quiet_settotalmass_warning()
    base, kwargs = split_env_id(env_id)
    if render_mode:
        kwargs = dict(kwargs, render_mode=render_mode)
    try:
        return gym.make(base, **kwargs)
    except ModuleNotFoundError as e:  # "package.module:Env-v0": gymnasium imports the module, which registers it
        raise EnvError(_missing_module(base, e)) from None
    except TypeError as e:  # a constructor argument the env does not take
        if render_mode and "render_mode" in str(e):
            raise EnvError(
                f"{base}: it takes no render_mode, so it cannot be filmed ({e}); give its constructor a render_mode "
                'argument and return RGB frames [H, W, 3] from render() when it is "rgb_array".'
            ) from None
        raise EnvError(f"{base}: {e}; check --env-kwargs against the env's constructor.") from None
    except gym.error.Error as e:  # NameNotFound, VersionNotFound, DependencyNotInstalled...
        if kwargs and not isinstance(e, (gym.error.NameNotFound, gym.error.VersionNotFound)):
            raise EnvError(f"{base} with --env-kwargs {kwargs}: {e}; check --env-kwargs against the env.") from None
        reason = str(e).strip()
        reason += "" if reason.endswith((".", "?", "!")) else "."  # gymnasium's "Did you mean: `X`?" keeps its "?"
        raise EnvError(
            f"unknown or unavailable environment id {env_id!r}: {reason} "
            "Use a gymnasium id such as CartPole-v1 or ALE/Pong-v5 (discrete actions) or HalfCheetah-v5 (continuous "
            "actions)."
        ) from e
    except Exception as e:  # noqa: BLE001 - the env's constructor refused a value given by --env-kwargs
        if not kwargs:
            raise
        raise EnvError(
            f"{base} could not be made with --env-kwargs {kwargs} ({type(e).__name__}: {e}); check their values "
            "against the env's constructor."
        ) from None


def check_env_kwargs(env_id: str) -> None:
    """For an env id with --env-kwargs: makes the env, resets it and takes one random step, so that a value the
    constructor stores but the env cannot use fails here, before any process starts; ids without kwargs are
    left alone (an unknown id fails in `env_spec`).

    Raises:
        EnvError: the env could not be made, reset or stepped with those kwargs (the message names them, the
            exception and the fix).
    """
    base, kwargs = split_env_id(env_id)
    if not kwargs or is_atari(env_id):
        return
    env = make_env(env_id)
    try:
        env.reset(seed=0)
        env.action_space.seed(0)
        env.step(env.action_space.sample())
    except Exception as e:  # noqa: BLE001 - whatever the env raises, said with its kwargs
        if isinstance(e, EnvError):  # e.g. the watch's EnvHang: its message says it all
            raise
        where = traceback.extract_tb(e.__traceback__)[-1]
        raise EnvError(
            f"{base} with --env-kwargs {kwargs} failed in its first reset or step ({type(e).__name__}: {e}, raised "
            f"at {where.filename}:{where.lineno}); check the values' types and ranges against the env's "
            "constructor, or the env's code there."
        ) from None
    finally:
        env.close()


def _distribution(module: str, packages: dict) -> str:
    """The installed distributions (of `packages`, `importlib.metadata.packages_distributions()`) that provide the
    top-level package of `module`, as "name version", sorted and joined (several may: a namespace package); ""
    where none does (a module found on PYTHONPATH). The same installs give the same text on every machine,
    whatever order the site folder lists them in."""
    top = module.split(".", 1)[0]
    found = []
    for name in sorted(set(packages.get(top, ()))):
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return ", ".join(found)


def _version(distribution: str) -> str:
    """The installed version of `distribution`, or "not installed"."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def env_identity(env_id: str) -> dict[str, str]:
    """What makes an env the same on two machines beyond its id and spaces (which `EnvSpec` holds): rlfleet's and
    gymnasium's versions, the distribution and version of the package its entry point is in (ale-py for Atari,
    gymnasium for MuJoCo and classic control, a user's package for its envs) with MuJoCo's version where it is a
    MuJoCo env, and its time limit. Two actors whose identities differ step different envs under one id (another
    time limit, another package version's dynamics or rewards).

    Raises:
        EnvError: the id is unknown (as `make_env`)."""
    base, _ = split_env_id(env_id)
    module_name, _, name = base.rpartition(":")
    try:
        if module_name:  # "package.module:Env-v0": the module registers it on import, as gym.make does
            importlib.import_module(module_name)
        spec = gym.spec(name)
    except ModuleNotFoundError as e:
        raise EnvError(_missing_module(base, e)) from None
    except (gym.error.Error, ImportError) as e:
        raise EnvError(f"{base}: {e}") from None
    entry = spec.entry_point if isinstance(spec.entry_point, str) else getattr(spec.entry_point, "__module__", "")
    module = str(entry).split(":", 1)[0]
    packages = importlib.metadata.packages_distributions()  # one scan of the installed distributions
    out = {
        "rlfleet": _version("rlfleet"),
        "gymnasium": _distribution("gymnasium", packages),
        "env_package": _distribution(module, packages)
        or f"{module.split('.', 1)[0]} (not installed as a distribution)",
        "time_limit": str(spec.max_episode_steps),
    }
    if "mujoco" in module:
        out["mujoco"] = _version("mujoco")
    return out


def policy_observations(obs):
    """Observations as every policy of rlfleet takes them (actors, the learner, evaluation, the exported model):
    float32 where they are floats (an env's float64 included), others (Atari's uint8 frames) as they are."""
    obs = np.asarray(obs)
    return obs.astype(np.float32) if obs.dtype.kind == "f" and obs.dtype != np.float32 else obs


@functools.lru_cache(maxsize=64)
def env_spec(env_id: str) -> EnvSpec:
    """Builds the env once and reads its spaces (Atari ids: after the `ATARI` preprocessing); the spec of an id is
    built once per process (cached: evaluations and the services' checks ask for it again).

    Raises:
        EnvError: unknown id, or an observation space that is not a flat Box
            (Atari frames excepted).
    """
    if is_atari(env_id):
        if split_env_id(env_id)[1]:
            raise EnvError(f"{env_id}: Atari envs take no --env-kwargs (their preprocessing is fixed: see ATARI).")
        return _atari_spec(env_id)
    env = make_env(env_id)
    try:
        obs, act = env.observation_space, env.action_space
        if not isinstance(obs, gym.spaces.Box) or len(obs.shape) != 1:
            rom = env.spec and env.spec.entry_point == "ale_py.env:AtariEnv" and env.spec.kwargs.get("game")
            if rom:  # a legacy Atari id (PongNoFrameskip-v4, Pong-v0...): raw frames; rlfleet's pipeline needs v5
                game = "".join(w.capitalize() for w in rom.split("_"))
                raise EnvError(
                    f"{env_id}: rlfleet's Atari pipeline (84x84 grey, 4-frame stack, frame skip 4, sticky actions "
                    f"0.25, Machado et al. 2018) takes the ALE v5 id of this game: --env ALE/{game}-v5."
                )
            raise EnvError(
                f"{env_id}: observation space {obs} is not a flat Box; rlfleet's MLP policies need vector observations."
            )
        if isinstance(act, gym.spaces.Box):
            if len(act.shape) != 1 or not np.all(np.isfinite(act.low)) or not np.all(np.isfinite(act.high)):
                raise EnvError(f"{env_id}: action space {act} must be a bounded 1-D Box.")
            return EnvSpec(
                env_id,
                tuple(obs.shape),
                "continuous",
                int(act.shape[0]),
                tuple(float(x) for x in act.low),
                tuple(float(x) for x in act.high),
                env.spec.max_episode_steps if env.spec else None,
            )
        if isinstance(act, gym.spaces.Discrete):
            if int(act.start) != 0:
                raise EnvError(
                    f"{env_id}: its actions are {act.start}..{act.start + act.n - 1} (Discrete with start="
                    f"{act.start}); rlfleet's discrete algorithms act with 0..{act.n - 1}. Wrap the env so that its "
                    f"actions start at 0 (gymnasium.wrappers.TransformAction(env, lambda a: a + {act.start}, "
                    f"action_space=gymnasium.spaces.Discrete({act.n}))), register that, and give its id."
                )
            return EnvSpec(
                env_id,
                tuple(obs.shape),
                "discrete",
                int(act.n),
                max_episode_steps=env.spec.max_episode_steps if env.spec else None,
            )
        raise EnvError(f"{env_id}: unsupported action space {act}.")
    finally:
        env.close()


def resolve_backend(env_id: str, backend: str) -> str:
    """Checks that `backend` fits `env_id` and returns it, "auto" turned into "ale" for Atari ids; for other
    ids "auto" stays "auto": the actor chooses by measurement (`rlfleet.actors.backend_choice.choose_backend`).

    Raises:
        EnvError: an Atari id with a backend other than "ale", or a non-Atari id with "ale".
    """
    if is_atari(env_id) != (backend == "ale") and backend != "auto":
        raise EnvError(
            f"env backend {backend!r} does not fit {env_id}: Atari ids (ALE/...) step on the "
            "'ale' backend (ale-py's AtariVectorEnv) and other envs on sync/workers/envpool/async; "
            "leave --env-backend at auto."
        )
    if backend == "auto" and is_atari(env_id):
        return "ale"
    return backend


def make_batched_env(
    env_id: str, num_envs: int, backend: str = "sync", num_workers: int | None = None
) -> gym.vector.VectorEnv:
    """Creates `num_envs` copies of `env_id` stepped as one batch.

    Observations come back as [num_envs, *obs_shape]; finished episodes are
    reset in the same step (gymnasium AutoresetMode.SAME_STEP), so the returned
    observation after a `done` is the first of the next episode.

    Args:
        backend: "sync" (all envs in the calling process), "workers" (worker
            processes of several envs each, `WorkerVectorEnv`), "envpool" (C++
            threads, see `EnvPoolVectorEnv`), "async" (one process per env,
            shared memory: the BatchPPO layout) or "ale" (Atari ids).
        num_workers: "workers" only: worker processes (None: `rlfleet.envs.workers.worker_count`).
    Raises:
        EnvError: unknown backend or env id; for "envpool" also envpool not
            installed, an env id envpool lacks, a non-Box env, or spaces that
            differ from gymnasium's.
    """
    if backend == "auto":
        raise EnvError(
            "make_batched_env takes a backend by name; 'auto' is chosen by measurement with "
            "rlfleet.actors.backend_choice.choose_backend."
        )
    if backend not in BACKENDS:
        raise EnvError(f"unknown env backend {backend!r}; choose one of {BACKENDS}.")
    resolve_backend(env_id, backend)  # refuses Atari ids off the ale backend and vice versa
    if backend == "ale":
        return make_atari_env(env_id, num_envs)
    if backend == "envpool":
        if split_env_id(env_id)[1]:
            raise EnvError(
                f"{env_id}: envpool makes its own envs and takes no --env-kwargs; leave --env-backend at auto, or "
                "choose sync or workers."
            )
        return EnvPoolVectorEnv(env_id, num_envs)
    make_env(env_id).close()  # fail fast here, not inside a worker process
    fns = [functools.partial(make_env, env_id) for _ in range(num_envs)]  # by reference: workers import this module
    if backend == "workers":
        return WorkerVectorEnv(fns, num_workers)
    mode = gym.vector.AutoresetMode.SAME_STEP
    if backend == "async":
        venv = gym.vector.AsyncVectorEnv(fns, shared_memory=True, context="spawn", autoreset_mode=mode)
    else:
        venv = gym.vector.SyncVectorEnv(fns, autoreset_mode=mode)
    return venv


def truncation_observations(obs: np.ndarray, terminated: np.ndarray, truncated: np.ndarray, info: dict) -> np.ndarray:
    """The observations a time limit cut off, for bootstrapping: float32 [B, *obs_shape].

    With SAME_STEP autoreset (every backend here) the observation a batched
    env returns for a finished episode is the first one of the next episode;
    the episode's last observation is in info["final_obs"] (an object array,
    valid where info["_final_obs"]): gymnasium's Sync/AsyncVectorEnv put it
    there, and so does `EnvPoolVectorEnv`. Row i holds that final observation
    where `truncated[i]` and not `terminated[i]` (a truncated episode's return
    continues past the cut: r + γ·V(final)), zeros elsewhere.

    Args:
        obs: [B, *obs_shape] observations returned by `step` (for shape and batch size).
        terminated / truncated: bool [B].
        info: the `step` info dict.
    Raises:
        EnvError: an env was truncated but the backend gave no final observation for it.
    """
    out = np.zeros(obs.shape, np.float32)
    cut = np.flatnonzero(np.asarray(truncated, bool) & ~np.asarray(terminated, bool))
    if len(cut) == 0:
        return out
    final, has = info.get("final_obs"), info.get("_final_obs")
    if final is None or has is None or not np.all(np.asarray(has)[cut]):
        raise EnvError(
            "the batched env truncated an episode but returned no info['final_obs'] for it; "
            "rlfleet needs SAME_STEP autoreset with final observations (make_batched_env)."
        )
    for i in cut:
        out[i] = np.asarray(final[i], np.float32)
    return out


class EnvPoolVectorEnv(gym.vector.VectorEnv):
    """envpool's C++ batch of `env_id`, with gymnasium's SAME_STEP autoreset.

    envpool resets a finished env on the *next* step call (a reset transition
    that ignores its action). Here the envs that finish in `step` are reset
    right away with envpool's per-env reset, so, as in the gymnasium backends,
    the returned observation of a finished env is the first one of its next
    episode; the episode-end observation goes to info["final_obs"] (object
    array, set where info["_final_obs"]). The time limit is gymnasium's
    `max_episode_steps` for `env_id`.

    Shapes/dtypes: reset(seed) -> (obs [B, *obs_shape], info); step(actions
    [B, *action_shape]) -> (obs [B, *obs_shape], reward float64 [B],
    terminated bool [B], truncated bool [B], info). obs has the dtype of
    gymnasium's observation space (float64 for MuJoCo), like the other backends.
    The single spaces are gymnasium's own.

    Raises (constructor):
        EnvError: envpool not installed, unknown env id (to gymnasium or to
            envpool), non-Box observation/action spaces, or envpool's
            observation/action shapes or action bounds differ from gymnasium's.
    """

    def __init__(self, env_id: str, num_envs: int):
        try:
            import envpool
        except ImportError as e:
            raise EnvError(
                "env backend 'envpool' needs envpool: pip install envpool==1.2.5 (or leave --env-backend at auto)."
            ) from e
        ref = make_env(env_id)
        try:
            obs_space, act_space = ref.observation_space, ref.action_space
            limit = ref.spec.max_episode_steps if ref.spec else None
        finally:
            ref.close()
        hint = "leave --env-backend at auto, or choose sync or workers"
        if env_id not in envpool.list_all_envs():
            raise EnvError(f"envpool has no environment {env_id!r}; {hint}.")
        if not (isinstance(obs_space, gym.spaces.Box) and isinstance(act_space, gym.spaces.Box)):
            raise EnvError(
                f"the envpool backend handles Box observation/action envs only, not "
                f"{env_id} ({obs_space}, {act_space}); {hint}."
            )
        pool_spec = envpool.make_spec(env_id)
        p_obs, p_act = pool_spec.observation_space, pool_spec.action_space
        same = (
            isinstance(p_act, gym.spaces.Box)
            and p_obs.shape == obs_space.shape
            and p_act.shape == act_space.shape
            and np.allclose(p_act.low, act_space.low)
            and np.allclose(p_act.high, act_space.high)
        )
        if not same:
            raise EnvError(
                f"envpool's {env_id} differs from gymnasium's (observations {p_obs} vs "
                f"{obs_space}, actions {p_act} vs {act_space}); {hint}."
            )
        self._envpool, self._env_id = envpool, env_id
        self._limit = int(limit) if limit is not None else int(np.iinfo(np.int32).max)
        self._ids = np.arange(num_envs, dtype=np.int32)
        self._pool = None
        self.num_envs = num_envs
        self.single_observation_space, self.single_action_space = obs_space, act_space
        self.observation_space = gym.vector.utils.batch_space(obs_space, num_envs)
        self.action_space = gym.vector.utils.batch_space(act_space, num_envs)
        self._open(list(range(num_envs)))

    def _open(self, seeds: list) -> None:
        if self._pool is not None:
            self._pool.close()
        self._pool = self._envpool.make_gymnasium(
            self._env_id,
            num_envs=self.num_envs,
            batch_size=self.num_envs,
            env_seed=[int(x) for x in seeds],
            max_episode_steps=self._limit,
        )

    def _obs(self, obs: np.ndarray, info: dict, ids: np.ndarray) -> np.ndarray:
        if not np.array_equal(info["env_id"], ids):  # sync mode answers in request order
            raise RuntimeError(f"envpool answered env ids {info['env_id']}, expected {ids}")
        return np.asarray(obs, self.single_observation_space.dtype)

    def reset(self, *, seed=None, options=None):
        """Resets all envs. `seed`: None, int (env i gets seed + i) or a list of B ints.

        envpool fixes seeds at creation, so a seeded reset rebuilds the pool.
        `options` is not supported (ValueError if given).
        """
        if options is not None:
            raise ValueError("EnvPoolVectorEnv.reset does not take options")
        if seed is not None:
            seeds = [seed + i for i in range(self.num_envs)] if np.isscalar(seed) else list(seed)
            if len(seeds) != self.num_envs:
                raise ValueError(f"expected {self.num_envs} seeds, got {len(seeds)}")
            self._open(seeds)
        obs, info = self._pool.reset()
        return self._obs(obs, info, self._ids), info

    def step(self, actions):
        """Steps all envs; finished envs come back already reset (see the class doc)."""
        obs, reward, terminated, truncated, info = self._pool.step(np.asarray(actions, np.float64))
        obs = self._obs(obs, info, self._ids)
        terminated, truncated = np.asarray(terminated, bool), np.asarray(truncated, bool)
        done = terminated | truncated
        if done.any():
            ids = np.flatnonzero(done).astype(np.int32)
            final = np.empty(self.num_envs, dtype=object)
            for i in ids:
                final[i] = obs[i]
            info = dict(info, final_obs=final, _final_obs=done)
            new_obs, new_info = self._pool.reset(ids)
            obs = obs.copy()
            obs[ids] = self._obs(new_obs, new_info, ids)
        return obs, np.asarray(reward, np.float64), terminated, truncated, info

    def close_extras(self, **kwargs) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
