"""The algorithm registry: every algorithm is one `AlgorithmBuilder`, looked up by its `--algo` name.

The actor loop, the replay server, the learner service, the CLI and the launcher know no algorithm by name:
they ask `get(name)` for its builder and call its typed methods (`rlfleet.algorithms.base`). A builder imports
its algorithm's modules when a method is called, so that importing the registry (the CLI does at start-up)
imports no TensorFlow and no algorithm code.

Built-in algorithms are the folders named in `BUILTIN` (`rlfleet.algorithms.ppo`, `.dqn`, `.qdagger`): each
folder's `__init__.py` defines its builder and registers it. Adding a built-in algorithm is one folder plus one
line in `BUILTIN` (and, for the wheel, its package name in pyproject.toml's `packages`). Algorithms outside this
package register themselves the same way when their module is imported. Every rlfleet process imports, before
its first lookup:
- the modules named in the environment variable RLFLEET_PLUGINS (separated by commas; a module name, or
  the path of a .py file), which `rlfleet up` passes on to the processes it starts, and
- the entry points of the group "rlfleet.algorithms" of installed distributions.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import threading
from typing import TYPE_CHECKING

from rlfleet.algorithms.base import AlgorithmBuilder

if TYPE_CHECKING:
    from rlfleet.envs.core import EnvSpec

PLUGINS_ENV = "RLFLEET_PLUGINS"
ENTRY_POINT_GROUP = "rlfleet.algorithms"
BUILTIN = (
    "rlfleet.algorithms.ppo",
    "rlfleet.algorithms.dqn",
    "rlfleet.algorithms.qdagger",
)
ACTION_SPACES = ("continuous", "discrete")


class UnknownAlgorithmError(ValueError):
    """`--algo` names no registered algorithm; the message lists the registered ones."""


_REGISTRY: dict[str, AlgorithmBuilder] = {}
_loaded = False
_plugin_error: ImportError | None = None  # raised again by every lookup after a plugin failed to import
_lock = threading.RLock()  # a plugin's import may register (and so look up) from the same thread


def register(algorithm: AlgorithmBuilder, replace: bool = False) -> AlgorithmBuilder:
    """Adds the builder `algorithm` under its name; returns it.

    Raises:
        TypeError: `algorithm` is not an `AlgorithmBuilder` instance.
        ValueError: the name is taken by another builder (unless `replace`), or a class attribute is invalid
            (name, action_space, uses_teacher without check_teacher).
    """
    _check_builder(algorithm)
    old = _REGISTRY.get(algorithm.name)
    if old is not None and old is not algorithm and not replace:
        raise ValueError(
            f"algorithm {algorithm.name!r} is already registered (by {_origin(old)}); choose another name, or "
            f"check that its module is not imported twice (as a module name and as a .py path in ${PLUGINS_ENV})."
        )
    _REGISTRY[algorithm.name] = algorithm
    return algorithm


def _check_builder(algorithm) -> None:
    if not isinstance(algorithm, AlgorithmBuilder):
        raise TypeError(f"register() takes an AlgorithmBuilder instance, not {type(algorithm).__name__}.")
    name = getattr(algorithm, "name", "")
    if not isinstance(name, str) or not name or name != name.strip().lower() or " " in name:
        raise ValueError(f"algorithm name {name!r}: use one lower-case word, e.g. 'ppo'.")
    if getattr(algorithm, "action_space", None) not in ACTION_SPACES:
        raise ValueError(f"algorithm {name}: action_space must be one of {ACTION_SPACES}.")
    if not isinstance(getattr(algorithm, "summary", None), str):
        raise ValueError(f"algorithm {name}: give it a one-line summary (class attribute `summary`).")
    if algorithm.uses_teacher and type(algorithm).check_teacher is AlgorithmBuilder.check_teacher:
        raise ValueError(f"algorithm {name}: uses_teacher needs a check_teacher method.")


def _origin(algorithm: AlgorithmBuilder) -> str:
    """Where a builder came from: the module of its class."""
    return type(algorithm).__module__


def get(name: str) -> AlgorithmBuilder:
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


def require_action_kind(spec: EnvSpec, algo: str) -> None:
    """Raises EnvError when the registered algorithm `algo`'s action space (`Algorithm.action_space`:
    continuous Box or discrete) does not fit `spec`; UnknownAlgorithmError (a ValueError) for an unknown
    `algo`."""
    from rlfleet.envs.core import EnvError

    alg = get(algo)
    if alg.action_space == spec.action_kind:
        return
    fitting = [
        a.name
        for a in map(get, names())
        if a.action_space == spec.action_kind and not a.uses_teacher  # one that runs on its own
    ]
    if spec.action_kind == "discrete":
        raise EnvError(
            f"{spec.env_id} has a discrete action space ({spec.action_dim} actions), but --algo {algo} "
            f"({alg.summary}) needs continuous Box actions. Use a MuJoCo env such as HalfCheetah-v5, or "
            f"--algo {' / '.join(fitting) or '(none registered)'} for discrete actions."
        )
    raise EnvError(
        f"{spec.env_id} has a continuous action space ({spec.action_dim} dimension"
        f"{'s' if spec.action_dim != 1 else ''}), but --algo {algo} "
        f"({alg.summary}) needs discrete actions. Use e.g. CartPole-v1, or --algo "
        f"{' / '.join(fitting) or '(none registered)'} for continuous actions."
    )


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


def describe_all() -> str:
    """Every registered algorithm as "name (summary)", for --help (a plugin that fails to import is left
    out here; every lookup names the error)."""
    try:
        load_plugins()
    except ImportError:
        pass
    return "; ".join(f"{_REGISTRY[n].name} ({_REGISTRY[n].summary})" for n in _names_loaded())


def _names_loaded() -> list[str]:
    """Built-in algorithms in `BUILTIN`'s order (those of one module as it registered them), then the others
    sorted."""
    module = {n: type(b).__module__ for n, b in _REGISTRY.items()}
    builtin = [n for m in BUILTIN for n in _REGISTRY if module[n] == m or module[n].startswith(m + ".")]
    builtin = list(dict.fromkeys(builtin))
    return builtin + sorted(n for n in _REGISTRY if n not in builtin)
