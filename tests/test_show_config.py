"""Every setting is documented where it is declared, and `rlfleet up --show-config` prints the resolved run."""

import dataclasses

import pytest
from conftest import rlfleet

from rlfleet.learner import presets


@pytest.mark.parametrize("cls", [presets.PPOConfig, presets.DQNConfig, presets.QDaggerConfig])
def test_every_setting_has_a_description(cls):
    docs = presets.describe(cls)
    assert set(docs) == {f.name for f in dataclasses.fields(cls)}
    assert not [k for k, v in docs.items() if len(v) < 10], "settings without a one-line description"


def test_show_config_prints_the_resolved_settings(tmp_path):
    out = rlfleet(
        "up", "--algo", "ppo", "--env", "Swimmer-v5", "--set", "learning_rate=1e-4", "--show-config",
        "--logdir", tmp_path / "run",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line for line in out.stdout.splitlines() if line and not line.startswith("#")}
    assert set(rows) == {f.name for f in dataclasses.fields(presets.PPOConfig)}
    # --set is marked and shown; the per-env override (Swimmer's discount) is resolved in.
    assert rows["learning_rate"].split()[1:3] == ["*", "0.0001"]
    assert rows["discount"].split()[1] == "0.9999"
    assert presets.describe(presets.PPOConfig)["discount"] in rows["discount"]
    assert not (tmp_path / "run").exists()  # nothing was started
    bad = rlfleet("up", "--algo", "dqn", "--env", "CartPole-v1", "--set", "learnig_rate=1", "--show-config")
    assert bad.returncode == 2 and "unknown DQN setting(s) ['learnig_rate']" in bad.stderr
