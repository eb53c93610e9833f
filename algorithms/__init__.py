"""The algorithm registry: every algorithm is one `Algorithm` definition, looked up by its `--algo` name.

The actor loop, the replay server, the learner service, the CLI and the launcher know no algorithm by name:
they ask `get(name)` for its parts. A definition names each part either as an object or as a
"module:attribute" string that is imported when first used, so that importing the registry (the CLI does
at start-up) imports no TensorFlow and no algorithm code. Built-in definitions: `rlfleet.algorithms.ppo`,
`.dqn`, `.qdagger`; README "Architecture" says how to add one.

Algorithms outside this package register themselves when their module is imported. Every rlfleet process
imports, before its first lookup:
- the modules named in the environment variable RLFLEET_PLUGINS (separated by commas; a module name, or
  the path of a .py file), which `rlfleet up` passes on to the processes it starts, and
- the entry points of the group "rlfleet.algorithms" of installed distributions.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import sys
import threading
from typing import Any

PLUGINS_ENV = "RLFLEET_PLUGINS"
ENTRY_POINT_GROUP = "rlfleet.algorithms"
BUILTIN = ("rlfleet.algorithms.ppo", "rlfleet.algorithms.dqn", "rlfleet.algorithms.qdagger")

Ref = Any  # an object, or "module:attribute" naming it (imported on first use)


@dataclasses.dataclass(frozen=True)
class Algorithm:
    """One algorithm: what each process needs of it. Parts given as "module:attribute" strings are imported
    when first used (`Algorithm.part`).

    Attributes:
        name: the `--algo` value (lower case, no spaces).
        summary: one line for `--help` and error messages.
        action_space: "continuous" (gymnasium Box) or "discrete" (Discrete): envs of the other kind are
            refused before anything starts.
        config_class: dataclass of the algorithm's settings; each field's declaration ends with a comment
            giving its meaning and unit (`rlfleet up --show-config` prints them). It must have a
            `to_json()` method, and the fields `envs_per_actor` (envs each actor steps), `eval_episodes`
            and `eval_every_updates` (evaluation cadence, in policy versions).
        presets: {preset name: {setting: value}}, with a "default" preset; `--config` chooses one.
        env_overrides: {(preset, env id): {setting: value}} applied on top of a preset for one env
            ("ALE/*" matches every Atari id); say in a comment why each is needed.
        tables: (spec: EnvSpec, config, queue_items: int | None) -> list[reverb.Table]: the replay
            server's tables, signatures included. `queue_items` is `rlfleet replay --queue-items`.
        collect: (actor: rlfleet.actors.actor.Actor, venv, weights, epoch: int) -> None: the actor-side
            writer: steps the batched env with the behaviour policy and writes items into the run's
            table until `actor.stop` is set (see `rlfleet.actors.writers` for the built-in ones and the
            helpers an actor offers).
        agent: (spec, config, seed: int, total_steps: int) -> rlfleet.learner.agents.Agent: the learner
            side (update rule, weights for actors, evaluation, status extras); `total_steps` is the run's
            env-step budget (0: none). With `uses_teacher` it is also given the keywords `teacher` (the
            teacher's run directory) and `teacher_replay` (host:port of the replay server with its
            replay).
        uses_teacher: the run learns from a teacher run directory (`--teacher`); the launcher then starts
            a second replay server with the teacher's replay.
        check_teacher: (directory: str, spec) -> dict: raises ValueError when `directory` cannot teach
            this algorithm on `spec` (required with `uses_teacher`).
        keeps_replay: the replay tables are checkpointed in the run directory (`RUN/replay`), restored
            on --resume, and written when the run finishes (so the run can be a teacher).
        unused_settings: settings of `config_class` (inherited) that this algorithm ignores: giving one
            is an error, with `unused_reason` as the explanation.
        legacy_settings: {setting: value} a run.json written before the setting existed meant (the
            behaviour then), so that --resume compares like with like.
        resume_requires: {setting: reason}: a run whose run.json lacks the setting cannot be resumed
            (its checkpoint predates a change of the algorithm); `reason` says why.
        status_values: {key: (label, format)} for status extras (`Agent.status_extras`) in
            `rlfleet status`, in this order (others follow under their key, 3 significant digits).
        progress_values: {key: (label, format)} for status extras shown in `rlfleet up`'s progress rows.
    """

    name: str
    summary: str
    action_space: str
    config_class: Ref
    presets: Ref
    tables: Ref
    collect: Ref
    agent: Ref
    env_overrides: Ref = dataclasses.field(default_factory=dict)
    uses_teacher: bool = False
    check_teacher: Ref = None
    keeps_replay: bool = False
    unused_settings: frozenset = frozenset()
    unused_reason: str = ""
    legacy_settings: dict = dataclasses.field(default_factory=dict)
    resume_requires: dict = dataclasses.field(default_factory=dict)
    status_values: dict = dataclasses.field(default_factory=dict)
    progress_values: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if not self.name or self.name != self.name.strip().lower() or " " in self.name:
            raise ValueError(f"algorithm name {self.name!r}: use one lower-case word, e.g. 'ppo'.")
        if self.action_space not in ("continuous", "discrete"):
            raise ValueError(f"algorithm {self.name}: action_space must be 'continuous' or 'discrete'.")
        if self.uses_teacher and self.check_teacher is None:
            raise ValueError(f"algorithm {self.name}: uses_teacher needs check_teacher.")
        for field in ("config_class", "presets", "env_overrides", "tables", "collect", "agent", "check_teacher"):
            ref = getattr(self, field)
            if isinstance(ref, str) and ":" not in ref:
                raise ValueError(f"algorithm {self.name}: {field} {ref!r} must be an object or 'module:attribute'.")

    def part(self, field: str):
        """The part `field` (e.g. "agent"), imported if it was given as "module:attribute".

        Raises:
            ImportError / AttributeError: the string names nothing.
        """
        return _resolve(getattr(self, field))

    def make_config(self, preset: str, env_id: str, overrides: dict | None = None):
        """The settings of a run: preset values, then the per-env overrides, then `overrides`.

        Raises:
            ValueError: unknown preset, unknown or unused setting, or a value of the wrong type or range.
        """
        from rlfleet.learner.presets import build_config

        return build_config(self, preset, env_id, overrides)


class UnknownAlgorithmError(ValueError):
    """`--algo` names no registered algorithm; the message lists the registered ones."""


_REGISTRY: dict[str, Algorithm] = {}
_loaded = False
_plugin_error: ImportError | None = None  # raised again by every lookup after a plugin failed to import
_lock = threading.RLock()  # a plugin's import may register (and so look up) from the same thread


def register(algorithm: Algorithm, replace: bool = False) -> Algorithm:
    """Adds `algorithm` under its name; returns it.

    Raises:
        ValueError: the name is taken by another definition (unless `replace`).
    """
    old = _REGISTRY.get(algorithm.name)
    if old is not None and old is not algorithm and not replace:
        raise ValueError(
            f"algorithm {algorithm.name!r} is already registered (by {_origin(old)}); choose another name, or "
            f"check that its module is not imported twice (as a module name and as a .py path in ${PLUGINS_ENV})."
        )
    _REGISTRY[algorithm.name] = algorithm
    return algorithm


def _origin(algorithm: Algorithm) -> str:
    """Where a definition came from: the module of its agent part."""
    agent = algorithm.agent
    return agent.partition(":")[0] if isinstance(agent, str) else getattr(agent, "__module__", "?")


def get(name: str) -> Algorithm:
    """The algorithm registered as `name`.

    Raises:
        UnknownAlgorithmError: no such algorithm (the message lists the registered ones and how to add one).
    """
    load_plugins()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownAlgorithmError(
            f"--algo {name}: no such algorithm (registered: {', '.join(names())}). An algorithm defined "
            f"outside rlfleet is registered by importing its module: name it in ${PLUGINS_ENV}."
        ) from None


def names() -> list[str]:
    """The registered algorithm names, built-in ones first."""
    load_plugins()
    return _names_loaded()


def load_plugins() -> None:
    """Imports the built-in definitions, then the $RLFLEET_PLUGINS modules and the "rlfleet.algorithms"
    entry points (once per process; thread-safe).

    Raises:
        ImportError: a plugin could not be imported; the message names each one that failed and its error
            (raised again by every later lookup, so that no command runs without it).
    """
    global _loaded, _plugin_error
    with _lock:
        if _plugin_error is not None:
            raise _plugin_error
        if _loaded:
            return
        _loaded = True
        for module in BUILTIN:
            importlib.import_module(module)
        failed = []
        for item in filter(None, (s.strip() for s in os.environ.get(PLUGINS_ENV, "").split(","))):
            try:
                _import_plugin(item)
            except Exception as e:
                failed.append(f"${PLUGINS_ENV} item {item!r}: {type(e).__name__}: {e}")
        from importlib.metadata import entry_points

        for ep in entry_points(group=ENTRY_POINT_GROUP):
            try:
                ep.load()
            except Exception as e:
                failed.append(f"entry point {ep.name} = {ep.value} ({ENTRY_POINT_GROUP}): {type(e).__name__}: {e}")
        if failed:
            _plugin_error = ImportError("cannot import the algorithm plugin(s): " + "; ".join(failed))
            raise _plugin_error


def _import_plugin(item: str) -> None:
    """Imports a module name, or a .py file under a name derived from its path (once; a file that is already
    imported as a module is not imported again)."""
    if not item.endswith(".py"):
        importlib.import_module(item)
        return
    path = os.path.abspath(item)
    if not os.path.isfile(path):
        raise ImportError(f"no such file {path}")
    if any(getattr(m, "__file__", None) == path for m in list(sys.modules.values())):
        return
    name = "rlfleet_plugin_" + "".join(c if c.isalnum() else "_" for c in path)
    if name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise


def _resolve(ref: Ref):
    if isinstance(ref, str) and ":" in ref:
        module, _, attr = ref.partition(":")
        obj = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
        return obj
    return ref


def describe_all() -> str:
    """Every registered algorithm as "name (summary)", for --help (a plugin that fails to import is left
    out here; every lookup names the error)."""
    try:
        load_plugins()
    except ImportError:
        pass
    return "; ".join(f"{_REGISTRY[n].name} ({_REGISTRY[n].summary})" for n in _names_loaded())


def _names_loaded() -> list[str]:
    builtin = [m.rsplit(".", 1)[1] for m in BUILTIN]
    return [n for n in builtin if n in _REGISTRY] + sorted(n for n in _REGISTRY if n not in builtin)
