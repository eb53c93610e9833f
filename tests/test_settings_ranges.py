"""Every numeric setting of every built-in algorithm declares its range, and any value outside it is refused
before anything starts, with a message naming the setting, the value, the range and the unit."""

import dataclasses
import math

import pytest

from rlfleet import algorithms
from rlfleet.algorithms.settings import build_config, describe, ranges

BUILT_IN = ("ppo", "dqn", "qdagger")
ENV = {"ppo": "Hopper-v5", "dqn": "CartPole-v1", "qdagger": "CartPole-v1"}


def _outside(r, integer: bool) -> list:
    """Values just outside range `r`, and the non-finite ones."""
    step = 1 if integer else 1e-3
    out = []
    if r.low is not None:
        out.append(r.low if r.low_open else r.low - step)
    if r.high is not None:
        out.append(r.high if r.high_open else r.high + step)
    if not integer:
        out += [math.nan, math.inf, -math.inf]
    return [int(v) if integer and math.isfinite(v) else v for v in out]


@pytest.mark.parametrize("algo", BUILT_IN)
def test_every_numeric_setting_declares_a_range(algo):
    cls = algorithms.get(algo).config_class()
    declared = ranges(cls)
    numeric = [f.name for f in dataclasses.fields(cls) if type(f.default) in (int, float, tuple)]
    assert numeric and sorted(set(numeric) - set(declared)) == []
    defaults = cls()
    for name, r in declared.items():  # the defaults themselves are in range
        assert getattr(defaults, name) in r, (name, getattr(defaults, name), str(r))


@pytest.mark.parametrize("algo", BUILT_IN)
def test_a_value_outside_a_settings_range_is_refused_naming_it(algo):
    algorithm = algorithms.get(algo)
    cls = algorithm.config_class()
    units = describe(cls)
    tried = 0
    for f in dataclasses.fields(cls):
        r = ranges(cls).get(f.name)
        if r is None:
            continue
        if isinstance(f.default, tuple):
            values = [[64, v] for v in _outside(r, True) if math.isfinite(v)] + [[]]
        else:
            values = _outside(r, isinstance(f.default, int))
        for v in values:
            with pytest.raises(ValueError) as e:
                build_config(algorithm, "default", ENV[algo], {f.name: v})
            message = str(e.value)
            assert f"setting {f.name} = " in message and str(r) in message and units[f.name] in message, message
            tried += 1
    assert tried > 2 * len(ranges(cls))


def test_settings_that_together_could_never_update_are_refused():
    ppo, dqn = algorithms.get("ppo"), algorithms.get("dqn")
    with pytest.raises(ValueError, match="no update would ever start"):
        build_config(ppo, "default", "Hopper-v5", {"batch_env_steps": 0, "batch_episodes": 0})
    assert build_config(ppo, "default", "Hopper-v5", {"batch_env_steps": 0, "batch_episodes": 5}).batch_episodes == 5
    with pytest.raises(ValueError, match="min_replay_size = 2000 is above replay_size = 1000"):
        build_config(dqn, "default", "CartPole-v1", {"replay_size": 1000, "min_replay_size": 2000})


def test_an_out_of_range_setting_is_an_error_before_anything_starts(tmp_path):
    from helpers import rlfleet

    out = rlfleet(
        "up",
        "--algo",
        "dqn",
        "--env",
        "CartPole-v1",
        "--total-steps",
        1000,
        "--logdir",
        tmp_path / "r",
        "--set",
        "publish_every=0",
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert "rlfleet: error: DQN setting publish_every = 0: must be >= 1" in out.stderr, out.stderr[-2000:]
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    "option,value",
    [("--actors", 0), ("--envs-per-actor", 0), ("--learner-port", 70000), ("--report-interval", 0), ("--seed", -1)],
)
def test_an_out_of_range_option_is_an_error_before_anything_starts(tmp_path, option, value):
    from helpers import rlfleet

    out = rlfleet(
        "up", "--algo", "ppo", "--env", "Hopper-v5", "--total-steps", 1000, "--logdir", tmp_path / "r", option, value
    )
    assert out.returncode == 2 and f"Invalid value for '{option}'" in out.stderr, out.stderr[-2000:]
    assert not (tmp_path / "r").exists()
