"""Reverb's client as an actor uses it (trajectory writers and the `ServerInfo` question), without loading
TensorFlow's Python.

Importing the `reverb` package imports all of TensorFlow: its `__init__` imports the tf.data datasets and the
TF client, and its `pybind` module imports `tensorflow` only so that TensorFlow's shared libraries are loaded
before Reverb's compiled client. What an actor writes with needs much less: the compiled client
(`reverb/libpybind.so`), which links against TensorFlow's framework library (`libtensorflow_framework.so.2`)
alone, and Reverb's Python `trajectory_writer` and `errors` modules, which import numpy and dm-tree. `load()`
loads exactly those, Reverb's own code from the installed package, and leaves no trace of them in
`sys.modules`, so a later `import reverb` in the same process imports the whole package as usual. That import
gets the same compiled module, but its own copies of the Python classes: `reverb.errors.DeadlineExceededError`
is then another class than the one these writers raise, which is why `deadline_exceeded_errors()` names both. An
actor so maps TensorFlow's framework library but does not import `tensorflow`, which was most of its memory (the
scaling guide: what one actor costs).

Where the installed Reverb lacks what is used here, or `reverb` was already imported, `load()` uses the whole
package. Call `load()` before starting threads that may import `reverb`: while it loads, `sys.modules["reverb"]`
is a stand-in without the package's names.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import importlib
import importlib.machinery
import importlib.util
import os
import sys
import threading
import types

from rlfleet.common.logs import logger

log = logger("actor")

_FRAMEWORK_LIBRARY = "libtensorflow_framework.so.2"  # what Reverb's compiled client links against


@dataclasses.dataclass(frozen=True)
class ReverbModules:
    """The Reverb modules a writer uses: `pybind` (the compiled client: `Client`, `AutoTunedChunkerOptions`),
    `trajectory_writer` (its `TrajectoryWriter`) and `errors` (`DeadlineExceededError`, `ReverbError`);
    `whole_package` tells whether they came with the whole `reverb` package (and TensorFlow)."""

    pybind: types.ModuleType
    trajectory_writer: types.ModuleType
    errors: types.ModuleType
    whole_package: bool


_loaded: ReverbModules | None = None
_lock = threading.Lock()


def load() -> ReverbModules:
    """Reverb's writer modules, loaded once per process (see the module doc). A Reverb whose files or compiled
    client lack what is used here is no error: the whole package is imported instead, with a warning.

    Raises:
        ImportError: Reverb or TensorFlow is not installed, or the whole package does not import either.
    """
    global _loaded
    with _lock:
        if _loaded is None:
            if "reverb" in sys.modules:
                _loaded = _whole_package()
            else:
                try:
                    _loaded = _writer_modules_alone()
                except (ImportError, OSError, AttributeError) as e:
                    log.warning(
                        "Reverb's client could not be loaded without TensorFlow's Python (%s): importing the whole "
                        "reverb package, which takes far more memory per actor",
                        e,
                    )
                    _loaded = _whole_package()
        return _loaded


def _whole_package() -> ReverbModules:
    import reverb  # noqa: F401  (imports TensorFlow)
    import reverb.errors
    import reverb.pybind
    import reverb.trajectory_writer

    return ReverbModules(reverb.pybind, reverb.trajectory_writer, reverb.errors, whole_package=True)


def _package_dir(name: str) -> str:
    """The folder of the installed package `name`, found without importing it. Raises ImportError."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"no installed package {name!r}")
    return list(spec.submodule_search_locations)[0]


def _writer_modules_alone() -> ReverbModules:
    reverb_dir, tf_dir = _package_dir("reverb"), _package_dir("tensorflow")
    # Loaded first, by its full path (nothing globs or searches it), and local to the process: the dynamic
    # linker then finds it by its soname when the compiled client asks for it, and none of its symbols can
    # shadow another library's (globally, its bundled crypto symbols break Python's hashlib).
    ctypes.CDLL(os.path.join(tf_dir, _FRAMEWORK_LIBRARY), mode=os.RTLD_NOW | os.RTLD_LOCAL)
    with _package_without_init("reverb", reverb_dir):
        name = "reverb.libpybind"
        loader = importlib.machinery.ExtensionFileLoader(name, os.path.join(reverb_dir, "libpybind.so"))
        pybind = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader))
        loader.exec_module(pybind)
        sys.modules["reverb.pybind"] = pybind  # what `from reverb import pybind` in the modules below finds
        errors = importlib.import_module("reverb.errors")
        trajectory_writer = importlib.import_module("reverb.trajectory_writer")
    for owner, names in (
        (pybind, ("Client", "AutoTunedChunkerOptions")),
        (pybind.Client, ("NewTrajectoryWriter", "ServerInfo")),
        (trajectory_writer, ("TrajectoryWriter",)),
        (errors, ("DeadlineExceededError",)),
    ):
        for name in names:
            if not hasattr(owner, name):  # another Reverb version: the fallback covers it, not a later call
                raise AttributeError(f"{getattr(owner, '__name__', owner)} has no {name}")
    return ReverbModules(pybind, trajectory_writer, errors, whole_package=False)


@contextlib.contextmanager
def _package_without_init(name: str, folder: str):
    """While open, `import NAME.sub` imports the module file `folder/sub.py` without running the package's
    `__init__`; afterwards `sys.modules` holds nothing of the package, as before."""
    package = types.ModuleType(name)
    package.__path__ = [folder]
    sys.modules[name] = package
    try:
        yield
    finally:
        for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
            del sys.modules[key]


class Client:
    """A client of the replay server at `address` (host:port) for actors: `trajectory_writer` as
    `reverb.Client.trajectory_writer` makes it, and `server_info_answered`. Clients of one address share one
    gRPC connection (Reverb creates every channel to an address with the same arguments)."""

    def __init__(self, address: str):
        self._modules = load()
        self._client = self._modules.pybind.Client(address)

    def trajectory_writer(self, num_keep_alive_refs: int):
        """A `reverb.TrajectoryWriter` whose columns keep the last `num_keep_alive_refs` (≥ 1) steps referable,
        with auto-tuned chunk lengths and items checked against the table signature before they are sent.

        Raises:
            ValueError: num_keep_alive_refs < 1.
        """
        if num_keep_alive_refs < 1:
            raise ValueError(f"num_keep_alive_refs must be at least 1, got {num_keep_alive_refs}")
        pybind = self._modules.pybind
        options = pybind.AutoTunedChunkerOptions(num_keep_alive_refs, 1.0)
        return self._modules.trajectory_writer.TrajectoryWriter(self._client.NewTrajectoryWriter(options, True))

    def server_info_answered(self, timeout_s: int) -> bool:
        """Whether the server answers Reverb's `ServerInfo` within `timeout_s` (whole seconds, at least 1) on this
        client's connection (the answer is not decoded: that would need TensorFlow)."""
        try:
            self._client.ServerInfo(max(1, int(timeout_s)))
            return True
        except (RuntimeError, ValueError):  # how Reverb's compiled client reports a failed call
            return False


def deadline_exceeded_errors() -> tuple[type[Exception], ...]:
    """The exceptions a writer's `flush(timeout_ms=...)` raises when its items are not confirmed in time: the
    class of the writers `Client.trajectory_writer` makes, and that of the whole `reverb` package's writers where
    it is imported (another class when `load()` loaded the writer modules alone: see the module doc)."""
    classes = [load().errors.DeadlineExceededError]
    package_errors = sys.modules.get("reverb.errors")
    if package_errors is not None and getattr(package_errors, "DeadlineExceededError", None) not in classes:
        classes.append(package_errors.DeadlineExceededError)
    return tuple(classes)
