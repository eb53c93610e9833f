"""Every setting is documented where it is declared, and `rlfleet up --show-config` prints the resolved run."""

import dataclasses
import json

import pytest
from helpers import rlfleet

from rlfleet import algorithms
from rlfleet.algorithms import settings
from rlfleet.algorithms.ppo.config import PPOConfig


@pytest.mark.parametrize("algo", algorithms.names())
def test_every_setting_has_a_description(algo):
    docs = settings.describe(algorithms.get(algo).config_class())
    assert not [k for k, v in docs.items() if len(v) < 10], "settings without a one-line description"


@dataclasses.dataclass
class _Base:
    colour: str = "#fff"  # colour of the thing (hex)
    kept: int = 1  # inherited text
    size: int = 2  # the base's text


@dataclasses.dataclass
class _Declared(_Base):
    # a comment line of its own describes nothing
    size: int = 3  # the subclass's text
    pragma: int = 3  # noqa: E501
    wrapped: tuple = (
        1,
        2,
    )  # a default over several lines
    bare: int = 4


def test_describe_reads_the_comment_that_ends_each_declaration():
    assert settings.describe(_Declared) == {
        "colour": "colour of the thing (hex)",  # the '#' in the string is not a comment
        "kept": "inherited text",
        "size": "the subclass's text",
        "pragma": "",
        "wrapped": "a default over several lines",
        "bare": "",
    }


@pytest.mark.slow
def test_show_config_prints_the_resolved_settings(tmp_path):
    out = rlfleet(
        "up", "--algo", "ppo", "--env", "Swimmer-v5", "--set", "learning_rate=1e-4", "--show-config",
        "--logdir", tmp_path / "run",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line for line in out.stdout.splitlines() if line and not line.startswith("#")}
    assert set(rows) == {f.name for f in dataclasses.fields(PPOConfig)}
    # --set is marked and shown; the per-env override (Swimmer's discount) is resolved in.
    assert rows["learning_rate"].split()[1:3] == ["*", "0.0001"]
    assert rows["discount"].split()[1] == "0.9999"
    assert settings.describe(PPOConfig)["discount"] in rows["discount"]
    assert rows["learning_rate"].endswith("[> 0]") and rows["activation"].endswith("[one of relu, tanh]"), rows
    assert not (tmp_path / "run").exists()  # nothing was started
    bad = rlfleet("up", "--algo", "dqn", "--env", "CartPole-v1", "--set", "learnig_rate=1", "--show-config")
    assert bad.returncode == 2 and "unknown DQN setting(s) ['learnig_rate']" in bad.stderr
    # The error names the setting meant and where every setting is listed.
    assert "did you mean 'learning_rate'?" in bad.stderr
    assert "`rlfleet up --algo dqn --env CartPole-v1 --config default --show-config`" in bad.stderr
    # Options that become settings are resolved in too (QDagger needs no --teacher just to show its settings).
    student = rlfleet("up", "--algo", "qdagger", "--env", "CartPole-v1", "--offline-steps", "500", "--show-config")
    assert student.returncode == 0, student.stderr
    assert [line.split()[1:3] for line in student.stdout.splitlines() if line.startswith("offline_steps ")] == [
        ["*", "500"]
    ]
    # Without --show-config, --total-steps is still required.
    run = rlfleet("up", "--algo", "ppo", "--env", "Hopper-v5", "--logdir", tmp_path / "run")
    assert run.returncode == 2 and "Missing option '--total-steps'" in run.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_one_settings_file_for_every_process(tmp_path):
    """`rlfleet settings` resolves the options once; replay, learner and up take the file with --run-config."""
    path = tmp_path / "s" / "settings.json"
    out = rlfleet(
        "settings", "--algo", "dqn", "--env", "CartPole-v1", "--set", "learning_rate=0.001", "--set", "hidden=[32, 32]",
        "--out", path, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    written = json.loads(path.read_text())
    assert (written["algo"], written["env_id"], written["preset"]) == ("dqn", "CartPole-v1", "default")
    assert written["config"]["learning_rate"] == 0.001 and written["config"]["hidden"] == [32, 32]
    assert written["config"]["target_update_period"] == 128  # the CartPole override, resolved
    # The file alone gives the same resolved settings as the options, stars included.
    from_file = rlfleet("up", "--run-config", path, "--show-config", timeout=120)
    from_flags = rlfleet(
        "up", "--algo", "dqn", "--env", "CartPole-v1", "--set", "learning_rate=0.001", "--set", "hidden=[32, 32]",
        "--show-config", timeout=120,
    )  # fmt: skip
    assert from_file.returncode == 0, from_file.stderr
    assert from_file.stdout == from_flags.stdout
    # The file is the whole configuration: other options next to it are refused, not merged.
    both = rlfleet("replay", "--run-config", path, "--set", "batch_size=8", "--port", "1", timeout=120)
    assert both.returncode == 2 and "leave out --set" in both.stderr
    # A file that the algorithm refuses names the setting.
    written["config"]["learning_rate"] = -1.0
    path.write_text(json.dumps(written))
    bad = rlfleet("learner", "--run-config", path, "--replay", "127.0.0.1:1", "--logdir", tmp_path / "r", timeout=120)
    assert bad.returncode == 2 and f"--run-config {path}" in bad.stderr and "learning_rate" in bad.stderr
