"""The code's layout holds: each algorithm lives in its own folder under `algorithms/`, the generic folders name
no algorithm, nothing imports in a cycle, and every registered algorithm's parts resolve and fit together
without a process being started."""

from __future__ import annotations

import ast
import dataclasses
import os
import tomllib

import pytest

from rlfleet import algorithms
from rlfleet.algorithms.base import Agent, AlgorithmBuilder
from rlfleet.algorithms.settings import build_config
from rlfleet.envs.core import env_spec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The modules that define what an algorithm implements and how it is looked up: they name no algorithm either.
INTERFACES = {"rlfleet.algorithms", "rlfleet.algorithms.base", "rlfleet.algorithms.settings"}
# The library the algorithms share and the generic folders use with them (networks, evaluation loops): no
# algorithm's folder either.
LIBRARY = "rlfleet.algorithms.library"


def _modules() -> dict[str, str]:
    """{module name: file} of every product module, as pyproject.toml maps the folders onto `rlfleet.*`."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        folders = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    found = {}
    for package, folder in folders.items():
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, folder)):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for name in filenames:
                if not name.endswith(".py"):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, name), os.path.join(ROOT, folder))[:-3].split(os.sep)
                if rel[-1] == "__init__":
                    rel = rel[:-1]
                found[".".join([package, *rel])] = os.path.join(dirpath, name)
    return found


def _runtime_imports(tree: ast.AST):
    """The Import / ImportFrom nodes of a module, at any depth, outside `if TYPE_CHECKING:` blocks."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _import_graph() -> dict[str, set[str]]:
    """{module: the product modules it imports}, function-level imports included."""
    modules = _modules()
    graph = {}
    for module, path in modules.items():
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        targets = set()
        for node in _runtime_imports(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                assert node.level == 0, f"{module}: relative import; the product imports by rlfleet.* names"
                base = node.module or ""
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            targets.update(n for n in names if n in modules)
        graph[module] = targets - {module}
    return graph


def _algorithm_folder(module: str) -> str | None:
    """The algorithm folder a module belongs to (e.g. "ppo"), or None for the generic and interface modules."""
    parts = module.split(".")
    if len(parts) >= 3 and parts[1] == "algorithms" and module not in INTERFACES and parts[2] != "library":
        return parts[2]
    return None


def test_the_generic_folders_and_the_interfaces_import_no_algorithm():
    graph = _import_graph()
    assert {"rlfleet.algorithms.ppo", "rlfleet.algorithms.dqn", "rlfleet.algorithms.qdagger"} <= set(graph)
    offending = sorted(
        f"{module} imports {target}"
        for module, targets in graph.items()
        if _algorithm_folder(module) is None
        for target in targets
        if _algorithm_folder(target) is not None
    )
    assert offending == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node of `graph` (each a cycle of imports)."""
    index, low, on_stack, stack, cycles, counter = {}, {}, set(), [], [], [0]

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


# The most lines a product function may span from its `def` (decorators excluded) to its last line.
MAX_FUNCTION_LINES = 60


def test_no_product_function_is_longer_than_the_limit():
    """Ruff holds the functions' branches, statements and parameters (pyproject.toml); this holds their length."""
    long = []
    for module, path in _modules().items():
        if ".proto.rlfleet_pb2" in module:
            continue  # generated by protoc
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{module}.{node.name}: {lines} lines")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (split them): {long}"


def test_nothing_imports_in_a_cycle():
    assert _cycles(_import_graph()) == []


# The floors of the house, lowest first: a folder imports only from its own floor or from the floors below it.
# The algorithm interface (INTERFACES) and library (LIBRARY) stand apart from the algorithm folders, which build
# on them and on the learner's checkpoints.
FLOORS = (
    ("common",),
    ("proto", "envs", "analysis"),
    ("algorithms (interface)", "algorithms (library)"),
    ("actors", "replay"),
    ("learner", "algorithms", "loadgen"),
    ("deploy",),
)


def _folder(module: str) -> str:
    if module in INTERFACES:
        return "algorithms (interface)"
    if module == LIBRARY or module.startswith(LIBRARY + "."):
        return "algorithms (library)"
    return module.split(".")[1]


def test_each_folder_imports_only_from_its_floor_and_below_and_no_two_folders_import_each_other():
    graph = _import_graph()
    floor = {folder: level for level, folders in enumerate(FLOORS) for folder in folders}
    folders = {}
    for module, targets in graph.items():
        folders.setdefault(_folder(module), {})
        for target in targets:
            if _folder(target) != _folder(module):
                folders[_folder(module)].setdefault(_folder(target), []).append(f"{module} imports {target}")
    assert set(folders) == set(floor), "a new top-level folder: give it a floor in FLOORS"
    upward = sorted(
        why for f, uses in folders.items() for t, whys in uses.items() if floor[t] > floor[f] for why in whys
    )
    assert upward == []
    both_ways = sorted((f, t) for f, uses in folders.items() for t in uses if f in folders.get(t, {}))
    assert both_ways == [], {pair: folders[pair[0]][pair[1]] for pair in both_ways}
    assert folders["common"] == {}  # the ground floor imports nothing of rlfleet


def test_an_algorithm_folder_reaches_another_only_one_way():
    """Folders may build on each other (QDagger on DQN), never both ways."""
    graph = _import_graph()
    uses = {
        (_algorithm_folder(m), _algorithm_folder(t))
        for m, targets in graph.items()
        for t in targets
        if _algorithm_folder(m) and _algorithm_folder(t) and _algorithm_folder(m) != _algorithm_folder(t)
    }
    assert ("qdagger", "dqn") in uses
    assert not [(a, b) for a, b in uses if (b, a) in uses]


def test_every_package_folder_is_in_the_wheel():
    """pyproject.toml lists the packages setuptools installs: a folder with an `__init__.py` that is not listed
    would be missing from the wheel and the Docker image."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        setuptools = tomllib.load(f)["tool"]["setuptools"]
    packages = {m for m, path in _modules().items() if os.path.basename(path) == "__init__.py"}
    assert packages - set(setuptools["packages"]) == set()


def test_every_builtin_is_a_folder_of_its_own_that_registers_a_builder():
    for module in algorithms.BUILTIN:
        folder = os.path.join(ROOT, "algorithms", module.rsplit(".", 1)[1])
        assert os.path.isfile(os.path.join(folder, "__init__.py")), module
    builtin = [m.rsplit(".", 1)[1] for m in algorithms.BUILTIN]
    assert algorithms.names()[: len(builtin)] == builtin
    for name in builtin:
        assert isinstance(algorithms.get(name), AlgorithmBuilder)
        # defined in its own folder (its package or a module of it)
        assert type(algorithms.get(name)).__module__.split(".")[:3] == ["rlfleet", "algorithms", name]


ENVS = {"continuous": "Pendulum-v1", "discrete": "CartPole-v1"}


@pytest.mark.parametrize("name", algorithms.names())
def test_every_algorithms_parts_resolve_and_fit_together(name, tmp_path):
    """Settings, presets, tables and (for algorithms that need no teacher) the agent, without any process: the
    agent reads the table the replay server would make, with its signature."""
    algorithm = algorithms.get(name)
    cls = algorithm.config_class()
    assert dataclasses.is_dataclass(cls) and callable(getattr(cls, "to_json", None))
    fields = {f.name for f in dataclasses.fields(cls)}
    assert {"envs_per_actor", "eval_episodes", "eval_every_updates"} <= fields
    assert "default" in algorithm.presets()
    for (preset, env_id), values in algorithm.env_overrides().items():
        assert preset in algorithm.presets() and set(values) <= fields, (preset, env_id)
    env_id = ENVS[algorithm.action_space]
    spec = env_spec(env_id)
    for preset in algorithm.presets():
        config = build_config(algorithm, preset, env_id)
        tables = algorithm.make_tables(spec, config, None)
        assert tables and all(t.name and t.info.signature for t in tables)
    if algorithm.uses_teacher:
        with pytest.raises(ValueError):
            algorithm.check_teacher(str(tmp_path / "no-run-here"), spec)
        return
    config = build_config(algorithm, "default", env_id)
    agent = algorithm.make_agent(spec, config, seed=0, total_steps=1000)
    assert isinstance(agent, Agent) and agent.algo == name
    table = {t.name: t for t in algorithm.make_tables(spec, config, None)}[agent.table]
    assert dict(table.info.signature) == agent.signature()
    weights = agent.export_weights()
    assert weights and all(hasattr(v, "shape") for v in weights.values())


def test_the_actor_and_the_builtin_writers_import_no_tensorflow():
    """What an actor of a vector env imports (the actor process, each built-in algorithm's writer and policy,
    Reverb's writer as `replay_client` loads it) leaves `tensorflow` and the `reverb` package unimported: they
    are most of a process's memory, and an actor needs neither (the scaling guide)."""
    import subprocess
    import sys

    modules = ["rlfleet.actors.actor", "rlfleet.deploy.cli"]
    for name in ("ppo", "dqn", "qdagger"):
        modules += [
            m
            for m in _modules()
            if m.startswith(f"rlfleet.algorithms.{name}.") and m.split(".")[-1] in ("items", "policy", "config")
        ]
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "from rlfleet.actors import replay_client\n"
        "assert not replay_client.load().whole_package\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'reverb', 'keras')))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "RLFLEET_PLUGINS"}  # built-ins only
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]", res.stdout
