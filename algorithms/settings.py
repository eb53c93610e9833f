"""The settings machinery every algorithm shares: a run's settings from a preset, per-env overrides and `--set`,
checked against the algorithm's settings dataclass, and the one-line description of each setting.

An algorithm declares its settings as a dataclass (`rlfleet.algorithms.base` says what it must hold), its
presets and its per-env overrides on its `AlgorithmBuilder`.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import io
import json
import os
import shlex
import textwrap
import tokenize
import typing

from rlfleet.algorithms.base import Choice, Range
from rlfleet.envs import gym_id

# Settings the learner service reads from every algorithm's config: their ranges hold for a config class that
# declares none (an algorithm plugin's plain `int` fields).
SERVICE_RANGES = {name: Range(1) for name in ("envs_per_actor", "unroll_length", "eval_episodes", "eval_every_updates")}


def ranges(cls) -> dict[str, Range]:
    """The declared `Range` of each field of the config dataclass `cls` (`SERVICE_RANGES` where it declares
    none)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    out = {}
    for f in dataclasses.fields(cls):
        declared = [m for m in getattr(hints.get(f.name), "__metadata__", ()) if isinstance(m, Range)]
        if declared:
            out[f.name] = declared[0]
        elif f.name in SERVICE_RANGES:
            out[f.name] = SERVICE_RANGES[f.name]
    return out


def choices(cls) -> dict[str, tuple]:
    """The values each named-choice field of the config dataclass `cls` may take (declared with `OneOf`)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    out = {}
    for f in dataclasses.fields(cls):
        declared = [m for m in getattr(hints.get(f.name), "__metadata__", ()) if isinstance(m, Choice)]
        if declared:
            out[f.name] = declared[0].values
    return out


def build_config(algorithm, preset: str, env_id: str, overrides: dict | None = None):
    """`algorithm`'s settings (an `rlfleet.algorithms.base.AlgorithmBuilder`): its preset's values, then its
    per-env overrides, then `overrides`, checked against its config dataclass (names, types, the declared
    `OneOf` choices and `Range` of each setting, and the checks across settings its `__post_init__` makes).

    Raises:
        ValueError: naming the setting, what is wrong and the fix.
    """
    cls, name = algorithm.config_class(), algorithm.name
    presets, env_overrides = algorithm.presets(), algorithm.env_overrides()
    if preset not in presets:
        raise ValueError(f"unknown --config preset {preset!r} for {name}; choose one of {sorted(presets)}.")
    env_arg, env_id = env_id, gym_id(env_id)  # per-env overrides name the gymnasium id, whatever its --env-kwargs
    per_env = env_overrides.get((preset, env_id))
    if per_env is None and env_id.startswith("ALE/"):
        per_env = env_overrides.get((preset, "ALE/*"))
    values = {**presets[preset], **(per_env or {}), **(overrides or {})}
    fields = {f.name: f for f in dataclasses.fields(cls)}
    valid, named = ranges(cls), choices(cls)
    bad = sorted(set(values) - set(fields))
    if bad:
        close = {k: difflib.get_close_matches(k, fields, n=1) for k in bad}
        hints = "".join(f" {k!r}: did you mean {m[0]!r}?" for k, m in close.items() if m)
        show = shlex.join(["rlfleet", "up", "--algo", name, "--env", env_arg, "--config", preset, "--show-config"])
        raise ValueError(
            f"unknown {name.upper()} setting(s) {bad};{hints} valid settings: {sorted(fields)} "
            f"(`{show}` prints each with its value and meaning)."
        )
    for k, v in values.items():  # JSON overrides give lists where the config holds tuples
        if isinstance(v, list) and isinstance(fields[k].default, tuple):
            values[k] = v = tuple(v)
        _check_type(name, k, v, fields[k].default)
        if k in named and v not in named[k]:
            raise ValueError(
                f"{name.upper()} setting {k} = {v!r}: choose one of {list(named[k])}; "
                "fix it in --set or the --config-file."
            )
        if k in valid and v not in valid[k]:
            what = describe(cls).get(k)
            must = f"a non-empty list, each element {valid[k]}" if isinstance(v, tuple) else str(valid[k])
            raise ValueError(
                f"{name.upper()} setting {k} = {v!r}: must be {must}"
                + (f" ({what})" if what else "")
                + "; fix it in --set or the --config-file."
            )
    # A setting the algorithm does not use is refused when it is given a value of its own (a run's recorded
    # settings hold every field, these at their defaults).
    unused = sorted(k for k in set(overrides or {}) & set(algorithm.unused_settings) if values[k] != fields[k].default)
    if unused:
        reason = f" ({algorithm.unused_reason})" if algorithm.unused_reason else ""
        raise ValueError(f"{name.upper()} does not use {unused}{reason}; remove them.")
    config = cls(**values)
    algorithm.check_config(config, env_arg)
    return config


def _check_type(name: str, key: str, value, default) -> None:
    """Raises ValueError when `value` cannot stand for a setting whose default is `default`."""
    kind = type(default)
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif kind is tuple:
        ok = (
            isinstance(value, tuple) and all(isinstance(x, type(default[0])) for x in value)
            if default
            else isinstance(value, tuple)
        )
    else:
        ok = isinstance(value, kind)
    if not ok:
        want = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(
            kind
        ) or f"a list like {list(default)}"
        raise ValueError(
            f"{name.upper()} setting {key} = {value!r}: expected {want} (default {default!r}); "
            "fix it in --set or the --config-file."
        )


def describe(cls) -> dict[str, str]:
    """Each field of the config dataclass `cls` -> the one-line description on its declaration.

    The description is the comment that ends the field's declaration (tokenized, so a '#' inside a default
    string is not one; noqa/type:/fmt: pragmas are skipped); a subclass's wins over its base's. A field
    without one maps to "" (tests/test_show_config.py fails on that).
    """
    found = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        own = klass.__dict__.get("__annotations__", {})
        source = textwrap.dedent(inspect.getsource(klass))
        line = []  # the tokens of the current logical line
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.NEWLINE:
                code = [t for t in line if t.type != tokenize.COMMENT]
                notes = [t.string.lstrip("#").strip() for t in line if t.type == tokenize.COMMENT]
                notes = [n for n in notes if n and not n.startswith(("noqa", "type:", "fmt:"))]
                if len(code) > 1 and code[0].string in own and code[1].string == ":" and notes:
                    found[code[0].string] = notes[-1]
                line = []
            elif tok.type == tokenize.NL and all(t.type == tokenize.COMMENT for t in line):
                line = []  # a blank or comment-only line belongs to no declaration
            elif tok.type not in (tokenize.INDENT, tokenize.DEDENT, tokenize.NL):
                line.append(tok)
    return {f.name: found.get(f.name, "") for f in dataclasses.fields(cls)}


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """One run's description: built once by the command line, written as RUN/settings.json and run.json
    (`to_json`), and read back as the same type by every process of the run (`from_json`).

    Attributes:
        algo: a registered algorithm's name.
        env_id: the gymnasium id, with its constructor arguments where `--env-kwargs` gave some (`ID?{...}`).
        preset: the preset the settings start from.
        overrides: {setting: value} that differ from the preset and its per-env overrides (what `--set` gives).
        config: the algorithm's settings dataclass, resolved from the three above (`build_config`).
        teacher: an algorithm with a teacher: the teacher's run directory (an absolute path); else None.
        seed: the run seed; None where not recorded (a file of `rlfleet settings`).
        total_steps: the env-step budget; None where not recorded.
    """

    algo: str
    env_id: str
    preset: str
    overrides: dict
    config: object
    teacher: str | None = None
    seed: int | None = None
    total_steps: int | None = None

    @classmethod
    def resolve(
        cls,
        algo: str,
        env_id: str,
        preset: str = "default",
        overrides: dict | None = None,
        teacher: str | None = None,
        seed: int | None = None,
        total_steps: int | None = None,
    ) -> RunSettings:
        """The settings of a run, resolved and checked (`make_algo_config`).

        Raises:
            ValueError: unknown algorithm, preset or setting, or a value out of its range (the message names it).
        """
        overrides = dict(overrides or {})
        config = make_algo_config(algo, preset, env_id, overrides)
        teacher = os.path.abspath(teacher) if teacher else None
        return cls(algo, env_id, preset, overrides, config, teacher, seed, total_steps)

    def with_changes(self, **changes) -> RunSettings:
        """A copy with `changes` (any attribute but `config`), resolved again where the settings change.

        Raises:
            ValueError: as `resolve`.
        """
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "config"}
        return RunSettings.resolve(**{**fields, **changes})

    def to_json(self) -> dict:
        """What settings.json and run.json hold: {"algo", "env_id", "preset", "config": {setting: value}}, and
        "teacher", "seed" and "total_steps" where known."""
        run = dict(algo=self.algo, env_id=self.env_id, preset=self.preset, config=json.loads(self.config.to_json()))
        if self.teacher:
            run["teacher"] = self.teacher
        if self.seed is not None:
            run["seed"] = int(self.seed)
        if self.total_steps is not None:
            run["total_steps"] = int(self.total_steps)
        return run

    @classmethod
    def from_json(cls, run: dict, where: str) -> RunSettings:
        """The settings `to_json` wrote; settings the file does not record take the preset's value.

        Raises:
            ValueError: missing keys, an unknown algorithm, settings the algorithm refuses, or a seed or budget
                that is not a whole number >= 0 (the message starts with `where`).
        """
        missing = [k for k in ("algo", "env_id", "preset", "config") if not isinstance(run, dict) or k not in run]
        if missing:
            raise ValueError(
                f"{where}: no {', '.join(missing)}; a settings file holds algo, env_id, preset and "
                "config (write one with `rlfleet settings --out FILE`)."
            )
        try:
            base = dataclasses.asdict(make_algo_config(run["algo"], run["preset"], run["env_id"]))
            recorded = run["config"]
            overrides = {k: v for k, v in recorded.items() if base.get(k, object()) != _plain(v, base.get(k))}
            settings = cls.resolve(run["algo"], run["env_id"], run["preset"], overrides, run.get("teacher"))
        except (ValueError, AttributeError, TypeError) as e:  # a value of the wrong kind: a list for a dict, say
            raise ValueError(f"{where}: {e}") from None
        seed, total_steps = run.get("seed"), run.get("total_steps")
        for name, value in (("seed", seed), ("total_steps", total_steps)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"{where}: {name} must be a whole number ≥ 0, not {value!r}.")
        return dataclasses.replace(settings, seed=seed, total_steps=total_steps)


def _plain(value, like):
    """A JSON value as the config holds it (lists as tuples where the config has a tuple)."""
    return tuple(value) if isinstance(value, list) and isinstance(like, tuple) else value


def make_algo_config(algo: str, preset: str, env_id: str, overrides: dict | None = None):
    """The settings of a run of the registered algorithm `algo` (`build_config` on its builder).

    Raises:
        ValueError: unknown algorithm (UnknownAlgorithmError), preset or setting.
    """
    from rlfleet import algorithms

    return build_config(algorithms.get(algo), preset, env_id, overrides)
