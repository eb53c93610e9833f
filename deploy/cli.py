"""The `rlfleet` command line: `up`, `replay`, `learner`, `actor`, `status`, `health`, `settings`,
`replay-checkpoint`, the commands used after a run (`rlfleet.deploy.run_tools`): `eval`, `export`, `report`, and
`import-teacher` (`rlfleet.deploy.teacher_tools`)."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import sys
import time
from typing import NamedTuple

import click

from rlfleet import algorithms
from rlfleet.algorithms.settings import RunSettings
from rlfleet.common import logs
from rlfleet.deploy.cli_common import Path, env_timeout_option, one_blas_thread
from rlfleet.deploy.cli_common import fail as _fail
from rlfleet.deploy.cli_common import quiet_tf as _quiet_tf
from rlfleet.deploy.up_options import UpOptions
from rlfleet.envs import ENV_BACKENDS
from rlfleet.learner.run_spec import ACTOR_TIMEOUT_S, START_TIMEOUT_S, RunSpec

log = logs.logger("cli")

# Run seeds: what every env backend and initialiser takes (derived env seeds are folded, `env_seeds`).
SEED = click.IntRange(0, 2**31 - 1)


def _load_config_file(path: str | None) -> dict:
    """The settings of a TOML config file (top-level `key = value` pairs)."""
    if not path:
        return {}
    import tomllib

    try:
        with open(path, "rb") as f:
            values = tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        _fail(
            f"--config-file {path}: not valid TOML ({e}); write one `key = value` per line, "
            "e.g. learning_rate = 1e-4 or hidden = [64, 64]."
        )
    nested = sorted(k for k, v in values.items() if isinstance(v, dict))
    if nested:
        _fail(
            f"--config-file {path}: sections or tables {nested} are not settings; put every setting at the top "
            "level as `key = value`."
        )
    return values


def parse_override(item: str) -> tuple[str, object]:
    """One "KEY=VALUE" preset override -> (key, value): the value parsed as JSON (1e-4, [64, 64], true), else
    kept as the string (e.g. linear). `--set` and benchmarks/distillation.py's variants read overrides this way.

    Raises:
        ValueError: no "=" in `item`.
    """
    if "=" not in item:
        raise ValueError(f"{item!r}: expected KEY=VALUE")
    key, value = item.split("=", 1)
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def _parse_overrides(items: tuple[str, ...], config_file: str | None = None) -> dict:
    out = _load_config_file(config_file)
    for item in items:
        try:
            key, value = parse_override(item)
        except ValueError:
            _fail(f"--set {item!r}: expected KEY=VALUE, e.g. --set learning_rate=1e-4")
        out[key] = value
    return out


def _check_algo(algo: str) -> algorithms.AlgorithmBuilder:
    """The registered algorithm `algo`; exits with the list of registered ones if there is none."""
    try:
        return algorithms.get(algo)
    except (ValueError, ImportError) as e:
        _fail(str(e))


def _check_teacher_args(algo: str, teacher: str | None, offline_steps: int | None, need_teacher: bool = True) -> dict:
    """--teacher belongs to (and, when `need_teacher`, is required by) algorithms with a teacher (QDagger);
    --offline-steps becomes the offline_steps setting of algorithms that have it: returns {"offline_steps": G}
    then, else {}."""
    alg = _check_algo(algo)
    with_teacher = [a for a in algorithms.names() if algorithms.get(a).uses_teacher]
    if alg.uses_teacher and need_teacher and not teacher:
        _fail(
            f"--algo {algo} needs --teacher DIR: the run directory of a finished run it can learn from "
            "(for qdagger: an `rlfleet up --algo dqn` run on the same env)."
        )
    if not alg.uses_teacher and teacher:
        _fail(
            f"--teacher is for algorithms that learn from a teacher ({', '.join(with_teacher) or 'none'}), not {algo}."
        )
    has_offline = "offline_steps" in {f.name for f in dataclasses.fields(alg.config_class())}
    if offline_steps is not None and not has_offline:
        _fail(f"--offline-steps is a setting of {algo}'s config only if it has one; {algo} has no offline_steps.")
    if offline_steps is None:
        return {}
    if offline_steps < 0:
        _fail(f"--offline-steps {offline_steps}: must be >= 0.")
    return {"offline_steps": offline_steps}


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.pass_context
def main(ctx):
    """rlfleet: distributed actor-learner RL (actors -> Reverb replay -> TensorFlow learner)."""
    level = (os.environ.get(logs.LEVEL_ENV) or logs.DEFAULT_LEVEL).lower()
    if level not in logs.LEVELS:
        _fail(f"${logs.LEVEL_ENV}={level!r}: use one of {', '.join(logs.LEVELS)}, or unset it.")
    logs.configure(ctx.invoked_subcommand or "rlfleet", level)  # a service sets its own with --log-level
    from rlfleet.common.limits import raise_open_file_limit
    from rlfleet.common.parent import die_with_parent

    raise_open_file_limit()  # envs' processes and actors' connections: as many as the system allows
    die_with_parent()  # a process of `rlfleet up` stops when `up` dies


def _logged(role: str):
    """A service command's `--log-level` (default: $RLFLEET_LOG_LEVEL, else info): its lines, and those of the
    processes it starts, go to one log channel (`rlfleet.common.logs`) as `role`."""

    def wrap(f):
        @functools.wraps(f)
        def run(*args, log_level: str, **kwargs):
            log_level = log_level.lower()
            logs.configure(role, log_level)
            os.environ[logs.LEVEL_ENV] = log_level  # the processes it starts (`up`'s) log at the same level
            return f(*args, **kwargs)

        return click.option(
            "--log-level",
            type=click.Choice(list(logs.LEVELS), case_sensitive=False),
            default=logs.DEFAULT_LEVEL,
            envvar=logs.LEVEL_ENV,
            show_default=True,
            show_envvar=True,
            help="The least level of the lines this process logs (notice: what `up` shows of its processes).",
        )(run)

    return wrap


class SettingsGiven(NamedTuple):
    """What a command was given of a run's settings: the common options (--algo, --env, --config, --set,
    --config-file, --run-config) and, where the command has them, the options that change one setting
    (--envs-per-actor, --teacher, --offline-steps); None (or ()) where not given."""

    algo: str | None = None
    env_id: str | None = None
    preset: str | None = None
    overrides: tuple = ()
    config_file: str | None = None
    run_config: str | None = None
    envs_per_actor: int | None = None
    teacher: str | None = None
    offline_steps: int | None = None


def _gathered(into: str, kind, names=None):
    """A command's options as one argument: those named by the fields of the class `kind()` returns (imported
    when the command runs), or by `names`, reach the command as its argument `into`, `kind()(**them)` (a
    dict when `names` is given); fields whose option the command does not have take their defaults."""

    def wrap(f):
        @functools.wraps(f)
        def run(*args, **kwargs):
            cls = kind()
            fields = names or getattr(cls, "_fields", None) or [x.name for x in dataclasses.fields(cls)]
            picked = {n: kwargs.pop(n) for n in fields if n in kwargs}
            kwargs[into] = picked if names else cls(**picked)
            return f(*args, **kwargs)

        return run

    return wrap


_common = [
    click.option(
        "--algo",
        default=None,
        help=f"Algorithm (default: ppo): {algorithms.describe_all()}. More register through $RLFLEET_PLUGINS "
        "(docs: Adding an algorithm).",
    ),
    click.option(
        "--env",
        "env_id",
        default=None,
        help="gymnasium env id, e.g. HalfCheetah-v5, CartPole-v1 or ALE/Pong-v5 (required, unless --run-config or, "
        "for up, --resume).",
    ),
    click.option(
        "--env-kwargs",
        multiple=True,
        metavar="KEY=VALUE",
        expose_value=False,
        callback=lambda ctx, param, value: ctx.meta.__setitem__("env_kwargs", value),
        help="A constructor argument of the env (repeatable), passed to gymnasium.make in every process, e.g. "
        "--env-kwargs length=12; the value is read as JSON, else kept as a string. Recorded with the env in "
        "run.json and settings.json.",
    ),
    click.option(
        "--config",
        "preset",
        default=None,
        help="Hyperparameter preset of the algorithm (default: default; ppo also has paper, the BatchPPO "
        "reference values, and cleanrl, CleanRL's ppo_continuous_action.py; `rlfleet up --show-config` prints "
        "the settings).",
    ),
    click.option(
        "--set",
        "overrides",
        multiple=True,
        metavar="KEY=VALUE",
        help="Override one preset value (repeatable), e.g. --set learning_rate=1e-4.",
    ),
    click.option(
        "--config-file",
        type=Path(exists=True, dir_okay=False),
        default=None,
        help="TOML file of preset overrides, one `key = value` per line (e.g. learning_rate = 1e-4); "
        "--set values win over it.",
    ),
    click.option(
        "--run-config",
        type=Path(dir_okay=False),
        default=None,
        help="A run's resolved settings in place of --algo/--env/--config/--set/--config-file: a run.json, or "
        "a file from `rlfleet settings --out` (`up` gives RUN/settings.json to every process it starts). The "
        "learner waits for it to appear (--start-timeout).",
    ),
]


def _check_seeds_options(seeds, seed, options, parallel) -> None:
    """Exits with the reason where `up`'s --seeds/--parallel do not fit the other options (`options`: its
    `UpOptions`)."""
    resume, logdir, learner_port = options.resume, options.logdir, options.learner_port
    if not seeds:
        _fail("--parallel goes with --seeds (several runs at a time).")
    if seed is not None:
        _fail("--seed and --seeds: give one of them (--seeds 3 runs seed 3 alone).")
    if resume:
        _fail("--seeds and --resume: to continue the runs of --seeds, give the same command again (finished seeds "
              "are kept, the others continue from their checkpoints).")  # fmt: skip
    if not logdir:
        _fail("--seeds needs --logdir DIR: the folder of the runs (DIR/seed-S).")
    if learner_port and parallel > 1:
        _fail("--learner-port with --parallel > 1: the runs at a time would share the port; leave --learner-port out.")


def _recorded_partial(resume: str) -> dict:
    """The seed, budget, algorithm and preset the run directory `resume` records in its run.json, for a command
    that gives settings of its own (those it leaves out are the run's; the run directory check compares the
    rest); {} where run.json cannot be read."""
    try:
        with open(os.path.join(resume, "run.json")) as f:  # read as a path, never globbed
            run = json.load(f)
    except (OSError, ValueError):
        return {}
    return {k: run.get(k) for k in ("seed", "total_steps", "algo", "preset")} if isinstance(run, dict) else {}


def _recorded_settings(resume: str) -> RunSettings:
    """The settings the run directory `resume` records in its run.json (exits with a message on a damaged or
    missing file)."""
    from rlfleet.learner.run_dir import RunDirError, read_run_settings

    path = os.path.join(resume, "run.json")
    if not os.path.exists(path):
        _fail(
            f"--resume {resume}: no run.json there, so the run's settings are unknown; pass the run directory "
            "of an earlier run (it holds run.json and checkpoints/), or give --algo, --env and --set as the "
            "run was started."
        )
    try:
        return read_run_settings(path)
    except RunDirError as e:
        _fail(f"--resume {resume}: {e}")


def _teacher(given: str | None, s: RunSettings) -> str | None:
    """--teacher, or the teacher the --run-config file records; exits when both are given and differ."""
    if given and s.teacher and os.path.abspath(given) != os.path.abspath(s.teacher):
        _fail(f"--teacher {given} differs from the teacher {s.teacher} that --run-config records; give one of them.")
    return given or s.teacher


def _settings(given: SettingsGiven) -> RunSettings:
    """The run's settings from the common options or the --run-config file, resolved and checked (exits with a
    message on a conflict, a bad file or a bad setting); the setting options of `given` are not applied here
    (`_changed`)."""
    if given.run_config:
        _run_config_alone(given)
        from rlfleet.learner.run_dir import RunDirError, read_run_settings

        try:
            return read_run_settings(given.run_config)
        except RunDirError as e:
            _fail(f"--run-config {e}")
    if given.env_id is None:
        _fail("Missing option '--env' (a gymnasium env id; or give a whole configuration with --run-config).")
    algo = given.algo or "ppo"
    _check_algo(algo)
    overrides = _parse_overrides(given.overrides, given.config_file)
    return _resolved(algo, _env_with_kwargs(given.env_id), given.preset or "default", overrides)


def _resolved(*args, **kwargs) -> RunSettings:
    """`RunSettings.resolve(*args, **kwargs)`; exits with the message of a bad setting."""
    try:
        return RunSettings.resolve(*args, **kwargs)
    except ValueError as e:
        _fail(str(e))


def _changed(s: RunSettings, extra: dict, teacher: str | None) -> RunSettings:
    """`s` with the settings `extra` (from options such as --envs-per-actor) and the teacher `teacher`, resolved
    again only where they change it; exits with the message of a bad setting."""
    overrides = {**s.overrides, **extra}
    teacher = os.path.abspath(teacher) if teacher else None
    if overrides == s.overrides and teacher == s.teacher:
        return s
    try:
        return s.with_changes(overrides=overrides, teacher=teacher)
    except ValueError as e:
        _fail(str(e))


def _env_kwargs_given() -> tuple[str, ...]:
    """The command's --env-kwargs values (KEY=VALUE strings)."""
    return click.get_current_context().meta.get("env_kwargs", ())


def _env_with_kwargs(env_id: str) -> str:
    """`env_id` with the command's --env-kwargs (`rlfleet.envs.core.env_with_kwargs`); exits on a bad one."""
    from rlfleet.envs.core import EnvError, env_with_kwargs

    kwargs = {}
    for item in _env_kwargs_given():
        try:
            key, value = parse_override(item)
        except ValueError as e:
            _fail(f"--env-kwargs {e}, e.g. --env-kwargs length=12.")
        kwargs[key] = value
    try:
        return env_with_kwargs(env_id, kwargs)
    except EnvError as e:
        _fail(str(e))


def _check_env_backend(env_id: str, backend: str | None, env_timeout_s: float) -> None:
    """Exits with status 2 before any process starts when --env-backend cannot step `env_id` (an Atari id off
    "ale", an env envpool does not have or one given --env-kwargs on "envpool"), or when the env given --env-kwargs
    fails its first reset or step (`rlfleet.envs.core.check_env_kwargs`) or does not return from it within
    `env_timeout_s` seconds (`rlfleet.envs.watch.EnvWatch`)."""
    from rlfleet.envs.core import EnvError, check_env_kwargs, make_batched_env, resolve_backend
    from rlfleet.envs.watch import EnvWatch

    try:
        resolve_backend(env_id, backend or "auto")
        if backend == "envpool":
            make_batched_env(env_id, 1, "envpool").close()
        with EnvWatch(env_id, env_timeout_s, lambda: "env seed 0") as watch:
            watch.begin("first reset or step (the check of --env-kwargs)")
            try:
                check_env_kwargs(env_id)
            finally:
                watch.end()
    except EnvError as e:
        _fail(str(e))


# Options of more than one command, defined once (each command gives its own help where the meaning differs).
def _env_backend_option(help_text: str, default: str | None = "auto"):
    return click.option(
        "--env-backend",
        default=default,
        show_default=default is not None,
        type=click.Choice(["auto", *ENV_BACKENDS]),
        help=help_text,
    )


def _seed_option(help_text: str):
    return click.option("--seed", default=0, show_default=True, type=SEED, help=help_text)


def _logdir_option(help_text: str):
    return click.option("--logdir", default=None, type=Path(file_okay=False), help=help_text)


def _resume_option(help_text: str):
    return click.option("--resume", type=Path(exists=True, file_okay=False), default=None, help=help_text)


def _report_interval_option(help_text: str, dest: str = "report_interval"):
    return click.option(
        "--report-interval",
        dest,
        default=5.0,
        show_default=True,
        type=click.FloatRange(0, min_open=True),
        help=help_text,
    )


def _video_every_option(f):
    return click.option(
        "--video-every",
        type=click.IntRange(0),
        default=0,
        show_default=True,
        metavar="N",
        help="After every N-th evaluation, play its first episode again as a video: RUN/videos/env-steps-*.mp4 and "
        "TensorBoard (eval/video). Rendered on a thread of the learner while training goes on (0: none; docs: "
        "After a run).",
    )(f)


def _track_option(f):
    return click.option(
        "--track",
        multiple=True,
        type=click.Choice(["mlflow", "wandb"]),
        envvar="RLFLEET_TRACK",
        show_envvar=True,
        help="Also send the metrics rows to an experiment tracker (repeatable): mlflow (a file store in "
        'RUN/mlruns, or $MLFLOW_TRACKING_URI; pip install -e ".[mlflow]") or wandb (offline, RUN/wandb; pip install '
        '-e ".[wandb]"). A resumed run keeps its trackers.',
    )(f)


def _check_track(track: tuple) -> tuple:
    """`--track`, checked before anything starts; exported to the processes this one starts (`up`'s learner)."""
    from rlfleet.learner.trackers import TrackerError, check_trackers

    try:
        track = check_trackers(track)
    except TrackerError as e:
        _fail(str(e))
    if track:
        os.environ["RLFLEET_TRACK"] = " ".join(track)
    return track


def _teacher_option(help_text: str):
    return click.option("--teacher", type=Path(file_okay=False), default=None, help=help_text)


_offline_steps_option = click.option(
    "--offline-steps",
    type=click.IntRange(0),
    default=None,
    help="qdagger: gradient steps on the teacher's replay before any env step (default: preset).",
)


def common(f):
    """Adds the common options (`_common`); the command receives them, with the setting options it has
    (--envs-per-actor, --teacher, --offline-steps), as `given` (`SettingsGiven`)."""
    f = _gathered("given", lambda: SettingsGiven)(f)
    for opt in reversed(_common):
        f = opt(f)
    return f


_TOKEN_HELP = "Shared cluster token sent with every learner call (default: $RLFLEET_TOKEN; empty: none)."
_client_security = [
    click.option(
        "--tls-ca",
        type=Path(dir_okay=False),
        default=None,
        help="PEM of the CA that signed the learner's certificate; turns TLS on.",
    ),
    click.option(
        "--tls-cert",
        type=Path(dir_okay=False),
        default=None,
        help="PEM of this client's certificate (a learner started with --tls-client-ca asks for it).",
    ),
    click.option("--tls-key", type=Path(dir_okay=False), default=None, help="PEM of --tls-cert's private key."),
    click.option("--token", default=None, help=_TOKEN_HELP),
]


def client_security(f):
    """Adds --tls-ca/--tls-cert/--tls-key/--token; the command receives them as `security` (ClientSecurity)."""
    import functools

    @functools.wraps(f)
    def wrapper(*args, tls_ca, tls_cert, tls_key, token, **kwargs):
        from rlfleet.proto.security import ClientSecurity, SecurityError, check_certificate_files, token_from_env

        try:
            check_certificate_files(("--tls-ca", tls_ca, True), ("--tls-cert", tls_cert, False))
            security = ClientSecurity(tls_ca, tls_cert, tls_key, token_from_env(token))
        except SecurityError as e:
            _fail(str(e))
        return f(*args, security=security, **kwargs)

    for opt in reversed(_client_security):
        wrapper = opt(wrapper)
    return wrapper


_server_security_options = [
    click.option(
        "--tls-cert",
        type=Path(dir_okay=False),
        default=None,
        help="PEM certificate chain of this learner; with --tls-key turns TLS on.",
    ),
    click.option("--tls-key", type=Path(dir_okay=False), default=None, help="PEM private key of --tls-cert."),
    click.option(
        "--tls-client-ca",
        type=Path(dir_okay=False),
        default=None,
        help="Require client certificates signed by this CA (PEM): mutual TLS.",
    ),
    click.option(
        "--token",
        default=None,
        help="Shared cluster token every actor and status call must send (default: $RLFLEET_TOKEN; empty: none).",
    ),
]


def server_security(f):
    """Adds --tls-cert/--tls-key/--tls-client-ca/--token; the command receives them checked as `security`: (TLS
    files (cert, key, client CA or None) or None for plaintext, token) (`_server_security`)."""

    @functools.wraps(f)
    def run(*args, tls_cert, tls_key, tls_client_ca, token, **kwargs):
        _quiet_tf()  # its check comes first, as in every command that runs TensorFlow
        return f(*args, security=_server_security(tls_cert, tls_key, tls_client_ca, token), **kwargs)

    for opt in reversed(_server_security_options):
        run = opt(run)
    return run


def _server_security(tls_cert, tls_key, tls_client_ca, token) -> tuple[tuple | None, str]:
    """The learner's TLS files ((cert, key, client CA or None), or None: plaintext) and its token (--token, else
    $RLFLEET_TOKEN); exits on a certificate without its key (or the reverse), a client CA without TLS, or a bad
    token."""
    from rlfleet.proto.security import SecurityError, check_certificate_files, server_credentials, token_from_env

    if bool(tls_cert) != bool(tls_key):
        _fail("--tls-cert and --tls-key go together (the learner's certificate and its private key).")
    if tls_client_ca and not tls_cert:
        _fail("--tls-client-ca needs TLS: also pass --tls-cert and --tls-key.")
    try:
        token = token_from_env(token)
        if tls_cert:
            server_credentials(tls_cert, tls_key, tls_client_ca)  # readable
            check_certificate_files(("--tls-cert", tls_cert, False), ("--tls-client-ca", tls_client_ca, True))
    except SecurityError as e:
        _fail(str(e))
    return ((tls_cert, tls_key, tls_client_ca) if tls_cert else None), token


def _logdir(logdir: str | None, resume: str | None) -> str:
    """--logdir, or the --resume directory when --logdir is not given; exits with a message if neither is."""
    if logdir is None and resume is None:
        _fail("Missing option '--logdir' (the run directory; when resuming, --resume DIR alone continues in DIR).")
    return logdir if logdir is not None else resume


def _show_config(run: RunSettings) -> None:
    """Prints every setting of the run's resolved config: name, value, description (with its unit) and the values
    it may take (its declared range or choices)."""
    from rlfleet.algorithms.settings import choices, describe, make_algo_config, ranges

    algo, preset, env_id, cfg = run.algo, run.preset, run.env_id, run.config
    base = dataclasses.asdict(make_algo_config(algo, preset, env_id))
    click.echo(
        f"# {algo} on {env_id}: preset {preset!r} with its per-env overrides; * = changed from that by "
        "--config-file, --set or an option (--envs-per-actor, --offline-steps)"
    )
    docs, valid, named = describe(type(cfg)), ranges(type(cfg)), choices(type(cfg))
    values = dataclasses.asdict(cfg)
    width = max(len(k) for k in values)
    for key, value in values.items():
        mark = "*" if value != base[key] else " "
        allowed = f" [{valid[key]}]" if key in valid else f" [one of {', '.join(named[key])}]" if key in named else ""
        click.echo(f"{key:<{width}} {mark} {json.dumps(value):<14} # {docs[key]}{allowed}")


@main.command()
@common
@click.option(
    "--total-steps",
    type=click.IntRange(1),
    default=None,
    help="Env steps to train for (agent steps: 4 frames each on Atari). Required, except with --show-config, "
    "or with --resume (default: the run's budget).",
)
@_logdir_option("Run directory (required, except with --resume: then that directory).")
@click.option("--actors", "num_actors", default=1, show_default=True, type=click.IntRange(1), help="Actor processes.")
@click.option("--envs-per-actor", type=click.IntRange(1), default=None, help="Envs per actor (default: preset).")
@click.option(
    "--seed",
    default=None,
    type=SEED,
    help="Run seed (networks, env seeds derive from it). Default: 0; with --resume, the run's own.",
)
@click.option(
    "--seeds",
    multiple=True,
    metavar="S,S-S",
    help="One run per seed, e.g. --seeds 0,1,2 or 0-4: each in LOGDIR/seed-S, one after another (or --parallel "
    "K at a time), then their report; the same command again continues them. In place of --seed.",
)
@click.option(
    "--parallel",
    type=click.IntRange(1),
    default=1,
    show_default=True,
    help="With --seeds: runs at a time (each with its own replay, learner and --actors actors).",
)
@click.option("--learner-port", type=click.IntRange(0, 65535), default=0, help="Learner port (default: a free one).")
@click.option(
    "--bind",
    default="127.0.0.1",
    show_default=True,
    help="Address the learner listens on; loopback keeps the cluster on this machine. A private address "
    "(or 0.0.0.0) lets actor machines attach; set RLFLEET_TOKEN first.",
)
@click.option(
    "--advertise",
    metavar="ADDR",
    default=None,
    help="The address of this machine that actors on other machines reach it at, told to them for the replay "
    "server (default: --bind; with 0.0.0.0, the address this machine's host name resolves to, or a refusal when "
    "that is loopback).",
)
@_env_backend_option(
    "sync: every env in the actor process; workers: a few worker processes of several envs each; envpool: C++ "
    "threads (Box-action envs it has, no --env-kwargs); async: one process per env (BatchPPO); ale: ale-py's C++ "
    "AtariVectorEnv (Atari ids only); auto: ale for Atari, else the fastest of sync, envpool and workers as each "
    "actor measures them on its own envs, the env's default (envpool where it applies, else sync) unless another is "
    "more than 10% faster (its log and status say which and why)."
)
@env_timeout_option
@_resume_option(
    "Continue from the latest checkpoint of this run directory. Alone, it takes the algorithm, env, settings, "
    "seed and budget from the run's run.json."
)
@_report_interval_option("Seconds between progress rows.")
@_video_every_option
@_track_option
@_teacher_option("qdagger: the run directory of a finished dqn run on the same env (its Q-network and replay).")
@_offline_steps_option
@click.option(
    "--show-config",
    is_flag=True,
    help="Print the resolved settings (preset, per-env overrides, --config-file, --set) with their "
    "descriptions and units, and exit without starting anything.",
)
@_gathered("options", lambda: UpOptions)
@_logged("up")
def up(given: SettingsGiven, options, seed, seeds, parallel, total_steps, show_config):
    """Run replay, learner and actors as local processes until --total-steps env steps.

    `--resume DIR` alone continues a run with the algorithm, env, preset, settings, seed and budget its run.json
    records; options given with it must match the run (--total-steps may change the budget)."""
    _quiet_tf()
    o = options
    s, recorded = _up_settings(o.resume, given)
    teacher = _teacher(given.teacher, s)
    extra = {"envs_per_actor": given.envs_per_actor} if given.envs_per_actor is not None else {}
    _check_env_backend(s.env_id, o.env_backend, o.env_timeout_s)
    extra.update(_check_teacher_args(s.algo, teacher, given.offline_steps, need_teacher=not show_config))
    o = dataclasses.replace(o, track=_check_track(o.track))
    run = _changed(s, extra, teacher)
    if show_config:
        _show_config(run)
        return
    if seeds or parallel > 1:
        _check_seeds_options(seeds, seed, o, parallel)
    seed, total_steps = _seed_and_budget(recorded, seed, total_steps)
    o = dataclasses.replace(o, logdir=_logdir(o.logdir, o.resume))
    if seeds:
        up_args = ["--actors", str(o.num_actors), "--env-backend", o.env_backend, "--bind", o.bind]
        up_args += ["--env-timeout", f"{o.env_timeout_s:g}"]
        up_args += ["--advertise", o.advertise] if o.advertise else []
        up_args += ["--report-interval", str(o.report_interval), "--video-every", str(o.video_every)]
        up_args += ["--learner-port", str(o.learner_port)] if o.learner_port else []
        sys.exit(_up_seeds(run, seeds, o.logdir, total_steps, parallel, up_args))
    from rlfleet.common.files import StorageError

    try:
        code = _launcher().launch(dataclasses.replace(run, seed=seed, total_steps=total_steps), o)
    except (_launcher().LaunchError, StorageError) as e:
        _fail(str(e))
    sys.exit(code)


def _launcher():
    """`rlfleet.deploy.launcher`, imported when `up` runs (it imports TensorFlow: checked and quieted first)."""
    _quiet_tf()
    from rlfleet.deploy import launcher

    return launcher


def _up_settings(resume: str | None, given: SettingsGiven) -> tuple[RunSettings, dict]:
    """`up`'s run settings, and the seed and budget of the run it resumes ({} for a new run): with `--resume` and
    no settings, the run's own; with settings, those given (the algorithm and preset the run's where not
    given)."""
    g = given
    settings_given = any((g.algo, g.env_id, g.preset, g.overrides, g.config_file, g.run_config, _env_kwargs_given()))
    if resume and not settings_given:  # the run's own settings
        s = _recorded_settings(resume)
        return s, dict(seed=s.seed, total_steps=s.total_steps)
    recorded = _recorded_partial(resume) if resume else {}
    if resume and not g.run_config:
        if g.env_id is None:
            _fail(
                f"--resume {resume} with settings: give --env too (and the run's --env-kwargs), or leave the "
                "settings out: --resume DIR alone takes them from the run."
            )
        # the run's algorithm and preset, unless given
        g = g._replace(algo=g.algo or recorded.get("algo"), preset=g.preset or recorded.get("preset"))
    return _settings(g), recorded


def _seed_and_budget(recorded: dict, seed: int | None, total_steps: int | None) -> tuple[int, int]:
    """--seed and --total-steps, else those the resumed run recorded (seed 0 for a new run); exits when there is
    no budget or it is not positive."""
    if seed is None:
        seed = recorded["seed"] if type(recorded.get("seed")) is int else 0
    if total_steps is None and type(recorded.get("total_steps")) is int:
        total_steps = recorded["total_steps"]
    if total_steps is None:
        _fail("Missing option '--total-steps' (env steps to train for; only --show-config goes without it).")
    if total_steps <= 0:  # a budget read from the run's run.json
        _fail(f"--total-steps {total_steps}: the budget must be a positive number of env steps; give --total-steps.")
    return seed, total_steps


def _up_seeds(run: RunSettings, seeds: str, logdir: str, total_steps: int, parallel: int, up_args: list) -> int:
    """`up --seeds`: the settings written once to DIR/settings.json, then one `up` per seed (`run_seeds`)."""
    from rlfleet.deploy.seeds import parse_seeds, run_seeds

    try:
        seed_list = parse_seeds(seeds, 2**31 - 1)
    except ValueError as e:
        _fail(str(e))
    _hold_run_dir(logdir, "up --seeds")  # each seed's `up` holds its own run directory
    settings_path = os.path.join(logdir, "settings.json")
    _write_settings(run, settings_path, click.echo)  # each seed's run adds its seed and budget
    return run_seeds(seed_list, logdir, settings_path, total_steps, parallel, up_args)


@main.command("replay")
@common
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    required=True,
    help="Port to serve Reverb on (0: a free one, printed at start).",
)
@click.option(
    "--queue-items",
    type=click.IntRange(1),
    default=None,
    help="Queue capacity in items (default: one update batch): how far actors may run ahead.",
)
@click.option(
    "--checkpoint-dir",
    type=Path(file_okay=False),
    default=None,
    help="dqn/qdagger: Reverb checkpoints go here (RUN_DIR/replay makes the run a teacher); the "
    "tables start from the latest one, and a new one is written on stop (unless the tables are "
    "unchanged since the latest one, which stop then names).",
)
@_teacher_option(
    "Serve this DQN run directory's replay read-only for a QDagger student (needs --checkpoint-dir for the copy)."
)
@click.option(
    "--checkpoint-interval",
    default=600.0,
    show_default=True,
    type=click.FloatRange(0),
    help="dqn/qdagger with --checkpoint-dir: seconds between Reverb checkpoints (0: only on stop), so "
    "that a replay server that crashes restarts with at most this much replay lost.",
)
@click.option(
    "--learner",
    "learner_address",
    default=None,
    help="Learner host:port: stop (after the final checkpoint) once its run is over for good (its status says "
    "finished) and its actors have left its status list; while it cannot be reached before that (a restart) keep "
    "serving. For docker-compose.",
)
@click.option(
    "--settings-out",
    type=Path(dir_okay=False),
    default=None,
    help="Also write the resolved settings here (as `rlfleet settings --out`) for the learner's --run-config; "
    "a file already there (a restart) must hold the same settings. docker-compose's replay service does this.",
)
@client_security
@_logged("replay")
def replay_cmd(
    given: SettingsGiven,
    port,
    queue_items,
    checkpoint_dir,
    checkpoint_interval,
    learner_address,
    settings_out,
    security,
):
    """Run the Reverb replay server (tables for --algo/--env)."""
    _quiet_tf()
    s = _settings(given)
    algo, env_id, teacher = s.algo, s.env_id, given.teacher
    alg = _check_algo(algo)

    from rlfleet.common.files import StorageError
    from rlfleet.envs.core import EnvError, env_spec
    from rlfleet.replay.server import serve, tables_for

    try:
        spec = env_spec(env_id)
        algorithms.require_action_kind(spec, algo)
        tables = tables_for(algo, spec, s.config, queue_items)
        if teacher and not alg.uses_teacher:
            with_teacher = [a for a in algorithms.names() if algorithms.get(a).uses_teacher]
            _fail(
                f"--teacher serves a teacher's replay to an algorithm that learns from one "
                f"({', '.join(with_teacher) or 'none registered'}); {algo} does not."
            )
        if checkpoint_dir and not alg.keeps_replay and not teacher:
            log.warning("%s's replay is not kept (an on-policy queue); --checkpoint-dir is ignored.", algo)
            checkpoint_dir = None
        if settings_out:  # once the settings are known to be valid: a typo is not recorded as the run's settings
            _write_settings(s, settings_out, lambda line: log.info("%s", line))
        if checkpoint_dir and not teacher:  # one server per checkpoint folder (a teacher's copy is made anew)
            _hold_run_dir(checkpoint_dir, "replay")
        serve(
            tables,
            port,
            checkpoint_dir=checkpoint_dir,
            source_dir=teacher,
            checkpoint_interval_s=checkpoint_interval,
            run_over=_run_over_probe(learner_address, security) if learner_address else None,
        )
    except (EnvError, ValueError, StorageError) as e:
        _fail(str(e))


def _recorded_fault(logdir: str) -> str | None:
    """The fault that `logdir`'s summary.json records (a run that failed, e.g. diverged) when its latest checkpoint
    is the one the failed run left (a run resumed and checkpointed since is not held to an old fault), else None."""
    from rlfleet.learner.checkpoints import newest_checkpoint_name  # imports TensorFlow, as the learner next does

    try:
        with open(os.path.join(logdir, "summary.json")) as f:
            summary = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(summary, dict) or not summary.get("fault"):
        return None
    newest = newest_checkpoint_name(os.path.join(logdir, "checkpoints"))
    if newest is None or newest != os.path.basename(str(summary.get("checkpoint") or "")):
        return None
    return summary["fault"]


# Asks of a learner that said its run finished which must find no answer, in a row, before the replay server
# takes it as gone (the asks are `rlfleet.replay.server.RUN_OVER_POLL_S` apart).
RUN_OVER_UNREACHABLE_ASKS = 3


def _run_over_probe(learner_address: str, security):
    """A function that says why the learner's run at `learner_address` is over, or None while it runs.

    Over: its status says finished and no actor is left in its status list (each said it is leaving, or timed
    out of it), so that a replay server that stops on this outlives the actors writing to it (under
    docker-compose's --exit-code-from, the first container to exit stops the others); or it said finished and
    cannot be reached since (it exited: `RUN_OVER_UNREACHABLE_ASKS` asks in a row found no answer). A learner
    that cannot be reached before it said finished is starting or restarting: keep serving."""
    from rlfleet.deploy.status import StatusError, get_status

    finished_phase = None  # the phase its status said when it first said finished
    unanswered = 0  # asks in a row since then that found no learner

    def run_over() -> str | None:
        nonlocal finished_phase, unanswered
        try:
            st = get_status(learner_address, timeout_s=2.0, security=security)
        except StatusError:
            if finished_phase is None:
                return None  # starting, restarting, or gone for a moment: keep serving
            unanswered += 1
            if unanswered < RUN_OVER_UNREACHABLE_ASKS:
                return None  # a busy learner, or a lost packet
            return f"the learner's run at {learner_address} is over (phase {finished_phase}) and it has exited"
        unanswered = 0
        if not st.get("finished"):
            return None
        finished_phase = finished_phase or st["phase"]
        if st.get("actors"):
            return None  # actors still leaving: they may be writing
        return f"the learner's run at {learner_address} is over (phase {st['phase']})"

    return run_over


@main.command("settings")
@common
@click.option(
    "--out", type=Path(dir_okay=False), default=None, help="Write the settings file here (default: print it)."
)
def settings_cmd(given: SettingsGiven, out):
    """Resolve --algo/--env/--config/--set/--config-file into one settings file (JSON: algo, env_id, preset,
    config) that `replay`, `learner` and `up` read with --run-config, so that every process of a cluster
    (docker-compose's services) runs with the same settings."""
    _quiet_tf()
    s = _settings(given)
    if out is None:
        click.echo(json.dumps(_settings_file(s), indent=2))
        return
    _write_settings(s, out, click.echo)


def _settings_file(s: RunSettings) -> dict:
    """A settings file's content: `s` without a seed or budget (each run that reads it gives its own)."""
    return dataclasses.replace(s, seed=None, total_steps=None).to_json()


def _write_settings(s: RunSettings, out: str, say) -> None:
    """Writes the resolved settings of `s` to `out`. When `out` exists (a restarted service, a second start of
    the same run) it must hold the same settings: a run keeps the settings it started with, so that its
    checkpoints and replay stay valid; exits naming the differences otherwise. `say` is given the line that
    tells what was done (`click.echo` for `rlfleet settings`, the log for a service)."""
    from rlfleet.learner.run_dir import write_json

    run = _settings_file(s)
    if os.path.exists(out):
        with open(out) as f:
            try:
                before = json.load(f)
            except json.JSONDecodeError as e:
                _fail(f"{out} is not a settings file ({e}); remove it or choose another path.")
        keys = sorted((before.keys() | run.keys()) - {"config"})
        diffs = [f"{k}: {before.get(k)!r} -> {run.get(k)!r}" for k in keys if before.get(k) != run.get(k)]
        old_cfg, new_cfg = before.get("config", {}), run["config"]
        diffs += [
            f"{k}: {old_cfg.get(k)!r} -> {new_cfg.get(k)!r}"
            for k in sorted(old_cfg.keys() | new_cfg.keys())
            if old_cfg.get(k) != new_cfg.get(k)
        ]
        if diffs:
            _fail(
                f"{out} holds other settings than the ones given ({'; '.join(diffs)}): a run keeps the settings it "
                "started with. Give those settings (with docker-compose: the same RLFLEET_ALGO, RLFLEET_ENV, "
                "RLFLEET_CONFIG), write to another path (docker-compose: a new RLFLEET_RUN), or remove the file."
            )
        say(f"{out} holds these settings already ({s.algo} on {s.env_id}, preset {s.preset})")
        return
    from rlfleet.common.files import StorageError, storage_error

    try:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        write_json(out, run)
    except StorageError as e:
        _fail(str(e))
    except OSError as e:
        _fail(str(storage_error(e, "the settings file", out)))
    say(f"wrote {out} ({s.algo} on {s.env_id}, preset {s.preset})")


@main.command("replay-checkpoint")
@click.option("--replay", "replay_address", required=True, help="Reverb server host:port.")
@click.option(
    "--timeout",
    default=600.0,
    show_default=True,
    type=click.FloatRange(0, min_open=True),
    help="Seconds to wait for the checkpoint.",
)
@click.option(
    "--checkpoint-dir",
    type=Path(file_okay=False),
    default=None,
    help="The server's --checkpoint-dir, if this machine sees it: prints the checkpoint's final folder there.",
)
def replay_checkpoint_cmd(replay_address, timeout, checkpoint_dir):
    """Have a running replay server write a Reverb checkpoint now; prints its directory."""
    _quiet_tf()
    from rlfleet.common.files import StorageError
    from rlfleet.replay.checkpoints import ReplayCheckpointError, checkpoint_replay

    try:
        path = checkpoint_replay(replay_address, timeout, checkpoint_dir)
    except (ReplayCheckpointError, StorageError) as e:
        _fail(str(e))
    click.echo(path or "written; the replay server keeps it as the newest ckpt-N of its --checkpoint-dir")


@main.command("learner")
@common
@click.option("--replay", "replay_address", required=True, help="Reverb server host:port.")
@click.option("--replay-for-actors", default=None, help="Replay address as actors dial it (default: --replay).")
@_logdir_option(
    "Run directory: checkpoints, metrics, TensorBoard, summary.json (required, except with "
    "--resume: then that directory)."
)
@click.option(
    "--total-steps", type=click.IntRange(0), default=0, show_default=True, help="Env steps (0: until stopped)."
)
@click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True, help="gRPC port (0: a free one).")
@click.option("--bind", default="127.0.0.1", show_default=True, help="Interface to listen on (0.0.0.0: all).")
@_seed_option("Network initialisation and actor env seeds.")
@_resume_option(
    "Continue from the latest checkpoint of this run directory (same --algo/--env/--config/--set "
    "and --config-file as its first start)."
)
@_env_backend_option("Env backend actors use (see `up`).")
@env_timeout_option
@_report_interval_option("Seconds between metrics rows (metrics.jsonl, TensorBoard).", "report_interval_s")
@_video_every_option
@_track_option
@click.option(
    "--checkpoint-interval",
    "checkpoint_interval_s",
    default=120.0,
    show_default=True,
    type=click.FloatRange(0),
    help="Seconds between learner checkpoints (a restarted learner continues from the latest).",
)
@click.option(
    "--linger",
    "linger_s",
    default=5.0,
    show_default=True,
    type=click.FloatRange(0),
    help="Seconds to keep serving after the run ends, so actors and the replay server see it is over (less once "
    "every actor has left and the replay server has stopped).",
)
@click.option(
    "--linger-for-replay/--no-linger-for-replay",
    default=True,
    show_default=True,
    help="Whether --linger also waits for the replay server to stop; --no-linger-for-replay where a supervisor "
    "stops it after the learner (rlfleet up does).",
)
@click.option(
    "--exit-code-if-stopped",
    default=0,
    show_default=True,
    type=click.IntRange(0, 255),
    help="Exit status when a stop (SIGTERM/SIGINT) ends the run before its env-step budget and final evaluation "
    "(0: a clean stop). docker-compose's learner sets 3, so that `up --exit-code-from learner` never reports an "
    "unfinished run as a success.",
)
@click.option("--port-file", type=Path(dir_okay=False), default=None, help="Write the bound port here once serving.")
@_teacher_option("qdagger: the teacher's run directory (a finished dqn run on the same env).")
@click.option(
    "--replay-source",
    "replay_sources",
    multiple=True,
    metavar="NAME=HOST:PORT",
    help="A replay the algorithm reads besides the run's own (repeatable), served by `rlfleet replay --teacher DIR`: "
    "qdagger's teacher=HOST:PORT.",
)
@click.option(
    "--teacher-replay",
    metavar="HOST:PORT",
    expose_value=False,
    callback=lambda ctx, param, value: ctx.meta.__setitem__("teacher_replay", value),
    help="qdagger: the same as --replay-source teacher=HOST:PORT.",
)
@_offline_steps_option
@click.option(
    "--auto-resume",
    is_flag=True,
    help="Resume from --logdir when it holds a checkpoint, else start a new run (for restarts by a "
    "supervisor such as docker-compose).",
)
@click.option(
    "--start-timeout",
    "start_timeout_s",
    default=START_TIMEOUT_S,
    show_default=True,
    type=click.FloatRange(0),
    help="Seconds to wait, in all, for the --run-config file to appear and the replay server to answer before "
    "giving up (exit 2); status answers meanwhile (phase waiting_for_settings, waiting_for_replay). Services may "
    "start in any order.",
)
@click.option(
    "--actor-timeout",
    "actor_timeout_s",
    default=ACTOR_TIMEOUT_S,
    show_default=True,
    type=click.FloatRange(0, min_open=True),
    help="Seconds without a heartbeat after which an actor leaves the status list.",
)
@server_security
@_gathered("served", lambda: RunSpec, names=[f.name for f in dataclasses.fields(RunSpec) if f.name != "settings"])
@_logged("learner")
def learner_cmd(
    given: SettingsGiven, served: dict, security, seed, total_steps, exit_code_if_stopped, port_file, auto_resume
):
    """Run the learner service of an algorithm against a replay server (started before or after it)."""
    import threading

    from rlfleet.common.stopping import on_stop_signals

    _quiet_tf()
    one_blas_thread()  # its evaluations' numpy products
    if served["video_every"]:
        from rlfleet.envs.video import use_offscreen_rendering

        use_offscreen_rendering()  # before MuJoCo is imported: videos render offscreen
    # counted from the process's start
    served["start_deadline"] = time.monotonic() + served["start_timeout_s"]
    # A stop before the learner serves (while it waits, or while it is built) ends it with --exit-code-if-stopped.
    stop = threading.Event()
    on_stop_signals(stop.set)
    served["tls"], served["token"] = security
    served["track"] = _check_track(served["track"])
    if given.run_config:
        _run_config_alone(given)
    served["logdir"] = _logdir(served["logdir"], served["resume"])
    served["replay_sources"] = _replay_sources(served["replay_sources"])
    server = None
    if given.run_config and not os.path.exists(given.run_config):
        server = _wait_for_settings(given.run_config, served, port_file, stop)
        if stop.is_set():
            server.stop()
            log.info("stopped while waiting for the run's settings %s.", given.run_config)
            sys.exit(exit_code_if_stopped)
    s = _settings(given)
    teacher = _teacher(given.teacher, s)
    s = _changed(s, _check_teacher_args(s.algo, teacher, given.offline_steps), teacher)
    _check_env_backend(s.env_id, served["env_backend"], served["env_timeout_s"])
    if auto_resume and served["resume"] is None:
        served["resume"] = _auto_resume(served["logdir"])
    # After the checks (a refused start writes nothing); a supervisor's restart (--auto-resume) waits for the old
    # process to let go, within its --start-timeout.
    _hold_run_dir(served["logdir"], "learner", served["start_timeout_s"] if auto_resume else 0.0)
    run = RunSpec(settings=dataclasses.replace(s, seed=seed, total_steps=total_steps), **served)
    summary = _run_learner(run, server, stop, port_file, exit_code_if_stopped)
    if not summary.get("completed"):
        sys.exit(exit_code_if_stopped)


def _hold_run_dir(directory: str, role: str, wait_s: float = 0.0) -> None:
    """Makes this process the one writer of `directory` (`rlfleet.common.run_lock.hold`, waiting up to `wait_s`
    seconds for another); exits (status 2) naming the process that writes it already."""
    from rlfleet.common import run_lock

    try:
        run_lock.hold(directory, role, wait_s)
    except run_lock.RunDirBusy as e:
        _fail(str(e))
    except OSError as e:
        from rlfleet.common.files import storage_error

        _fail(str(storage_error(e, "the run directory's lock file", directory)))


def _replay_sources(given: tuple[str, ...]) -> dict[str, str]:
    """{name: host:port} of the learner's --replay-source NAME=HOST:PORT options (and --teacher-replay HOST:PORT,
    the same as teacher=HOST:PORT); exits on one without a name or an address, or a name given twice."""
    teacher = click.get_current_context().meta.get("teacher_replay")
    sources: dict[str, str] = {}
    for item in (*given, *([f"teacher={teacher}"] if teacher else [])):
        name, _, address = item.partition("=")
        if not name or not address:
            _fail(f"--replay-source {item!r}: give NAME=HOST:PORT, e.g. --replay-source teacher=127.0.0.1:9000.")
        if name in sources:
            _fail(f"--replay-source {name} is given twice (--teacher-replay is teacher=HOST:PORT); give it once.")
        sources[name] = address
    return sources


def _run_learner(run, server, stop, port_file: str | None, exit_code_if_stopped: int) -> dict:
    """Builds and runs the learner of `run` (on `server` where one is bound already), writing its port to
    `port_file`; returns the run's summary. Exits with `exit_code_if_stopped` when stopped before it served, 2
    with the message of a bad env, setting, replay table, run directory or storage."""
    from rlfleet.common.files import StorageError
    from rlfleet.envs.core import EnvError
    from rlfleet.learner.errors import LearnerError, LearnerStopped
    from rlfleet.learner.service import Learner

    try:
        learner = Learner(run, server, stop_event=stop)
        if port_file and server is None:
            _write_port_file(port_file, learner.port)
        return learner.run()
    except LearnerStopped as e:
        log.info("%s; nothing was trained.", e)
        sys.exit(exit_code_if_stopped)
    except (EnvError, ValueError, LearnerError, StorageError) as e:
        if server is not None:
            server.stop()
        _fail(str(e))


def _run_config_alone(given: SettingsGiven) -> None:
    """Exits with a message when options that --run-config replaces are given beside it."""
    g = given
    named = [n for n, v in (("--algo", g.algo), ("--env", g.env_id), ("--config", g.preset)) if v is not None]
    named += ["--set"] * bool(g.overrides) + ["--config-file"] * bool(g.config_file)
    named += ["--env-kwargs"] * bool(_env_kwargs_given())
    if named:
        _fail(f"--run-config holds the whole configuration; leave out {', '.join(dict.fromkeys(named))}.")


def _write_port_file(path: str, port: int) -> None:
    """Writes the bound port into `path` atomically (readers never see it half written)."""
    from rlfleet.common.files import atomic_write

    atomic_write(path, str(port))


def _wait_for_settings(path: str, served: dict, port_file: str | None, stop):
    """Serves status (phase waiting_for_settings) where `served` (the learner's `RunSpec` fields) says, while it
    waits for the settings file `path` to appear, until its monotonic `start_deadline` (the end of its
    --start-timeout), with a line every few seconds; writes the bound port to `port_file`. Returns the bound
    `LearnerServer` for the learner to take over, also when `stop` (set by SIGTERM/SIGINT) ended the wait. Exits
    (status 2) when the time is up."""
    from rlfleet.learner.errors import LearnerError
    from rlfleet.learner.run_spec import WAIT_REPORT_S
    from rlfleet.learner.servicer import bind_learner_server

    try:
        server = bind_learner_server(None, served["bind"], served["port"], served["tls"], served["token"])
    except LearnerError as e:
        _fail(str(e))
    server.serve_waiting("waiting_for_settings", path)
    if port_file:
        _write_port_file(port_file, server.port)
    start = next_report = time.monotonic()
    deadline, timeout_s = served["start_deadline"], served["start_timeout_s"]
    while not os.path.exists(path) and not stop.is_set():
        now = time.monotonic()
        if now > deadline:
            server.stop()
            _fail(
                f"--run-config {path} did not appear within {timeout_s:.0f} s (--start-timeout). It is written by "
                "the replay service (`rlfleet replay --settings-out`) or by `rlfleet settings --out`: start that, "
                "or check the path."
            )
        if now >= next_report:
            log.info(
                "waiting for the run's settings %s (%.0f s; gives up %.0f s from now)",
                path,
                now - start,
                deadline - now,
            )
            next_report = now + WAIT_REPORT_S
        stop.wait(0.5)
    server.waiting = ("starting", "")
    return server


def _auto_resume(logdir: str) -> str | None:
    """`--auto-resume`: the run directory to resume (`logdir` when it holds a checkpoint, else None: a new run).
    Exits with the recorded fault when the run there failed: a supervisor's restart would resume into the same
    fault (and the services have stopped)."""
    if not os.path.exists(os.path.join(logdir, "checkpoints", "checkpoint")):
        return None
    fault = _recorded_fault(logdir)
    if fault:
        _fail(
            f"the run in {logdir} failed: {fault} Not resuming it: start a new run directory with changed "
            "settings (with docker-compose: another RLFLEET_RUN)."
        )
    return logdir


@main.command("actor")
@click.option("--learner", "learner_address", required=True, help="Learner host:port.")
@click.option("--replay", "replay_address", default=None, help="Override the replay address the learner announces.")
@click.option(
    "--num-envs", type=click.IntRange(0), default=0, help="Must match the run's envs per actor (default: take it)."
)
@_env_backend_option("Override the run's env backend.", default=None)
@click.option(
    "--connect-timeout", default=30.0, show_default=True, type=click.FloatRange(0, min_open=True), help="Seconds."
)
@client_security
@_logged("actor")
def actor_cmd(learner_address, replay_address, num_envs, env_backend, connect_timeout, security):
    """Run one actor that joins the learner at --learner."""
    _quiet_tf()
    one_blas_thread()
    from rlfleet.actors.actor import EXIT_STOPPED, Actor, ActorError
    from rlfleet.envs.core import EnvError
    from rlfleet.proto.security import SecurityError

    try:
        actor = Actor(learner_address, num_envs, replay_address, env_backend, connect_timeout, security)
        actor.run()
    except (ActorError, SecurityError) as e:
        _fail(str(e))
    except EnvError as e:
        _fail(f"the run's env cannot be stepped on this actor: {e}")
    if actor.terminated.is_set() and not actor.told_to_stop.is_set():
        log.info(
            "stopped before the run's end: exit %d, so that a supervisor (a Kubernetes Job) starts another",
            EXIT_STOPPED,
        )
        sys.exit(EXIT_STOPPED)


@main.command("status")
@click.option("--learner", "learner_address", required=True, help="Learner host:port.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON (snake_case fields).")
@click.option("--timeout", default=5.0, show_default=True, type=click.FloatRange(0, min_open=True), help="Seconds.")
@client_security
def status_cmd(learner_address, as_json, timeout, security):
    """Query the learner's status RPC."""
    from rlfleet.deploy.status import StatusError, format_status, get_status, to_json_ready
    from rlfleet.proto.security import SecurityError

    try:
        st = get_status(learner_address, timeout, security)
    except (StatusError, SecurityError) as e:
        _fail(str(e))
    click.echo(json.dumps(to_json_ready(st), indent=2, allow_nan=False) if as_json else format_status(st))


@main.command("health")
@click.option("--learner", "learner_address", default=None, help="Learner host:port: ask its gRPC health service.")
@click.option("--replay", "replay_address", default=None, help="Reverb server host:port: ask it for its tables.")
@click.option("--timeout", default=5.0, show_default=True, type=click.FloatRange(0, min_open=True), help="Seconds.")
@client_security
def health_cmd(learner_address, replay_address, timeout, security):
    """Exit 0 when the service answers (container health checks); exit 1 with the reason otherwise."""
    if bool(learner_address) == bool(replay_address):
        _fail("pass exactly one of --learner HOST:PORT or --replay HOST:PORT.")
    from rlfleet.deploy.status import check_health

    ok, message = check_health(learner_address, replay_address, timeout, security)
    click.echo(message, err=not ok)
    sys.exit(0 if ok else 1)


def _add_run_tools() -> None:
    """The commands used after a run (`rlfleet.deploy.run_tools`): eval, export, report; and the one that makes
    a teacher of a model trained elsewhere (`rlfleet.deploy.teacher_tools`): import-teacher."""
    from rlfleet.deploy.run_tools import eval_cmd, export_cmd, report_cmd
    from rlfleet.deploy.teacher_tools import import_teacher_cmd

    main.add_command(eval_cmd)
    main.add_command(export_cmd)
    main.add_command(report_cmd)
    main.add_command(import_teacher_cmd)


_add_run_tools()

if __name__ == "__main__":
    main()
