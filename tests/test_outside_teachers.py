"""Teachers trained outside rlfleet (`rlfleet import-teacher`): a Stable-Baselines3 DQN exported to ONNX, a
SavedModel of `rlfleet export`, data from a run's replay, a Minari dataset or the teacher's own acting; the
students learn from them through the whole cluster (real processes, loopback); bad teachers are refused."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import reverb
from helpers import ENV, ROOT, rlfleet

from rlfleet.algorithms.dqn.items import TABLE, batches
from rlfleet.algorithms.qdagger.outside import load_model
from rlfleet.envs.core import env_spec
from rlfleet.replay.checkpoints import checkpointer, open_teacher_replay

# Trains Stable-Baselines3's DQN briefly on CartPole-v1 and exports its Q-network to ONNX as SB3's docs show
# (a module wrapping model.q_net, torch.onnx.export with a dynamic batch axis); saves probe observations and
# SB3's own Q-values of them beside it.
_SB3_SCRIPT = """
import sys
import numpy as np, torch, gymnasium as gym
from stable_baselines3 import DQN
out = sys.argv[1]
model = DQN("MlpPolicy", gym.make("CartPole-v1"), learning_starts=500, target_update_interval=250, seed=0,
            policy_kwargs=dict(net_arch=[32]), device="cpu")
model.learn(2000)
class OnnxableQ(torch.nn.Module):
    def __init__(self, q_net):
        super().__init__()
        self.q_net = q_net
    def forward(self, observation):
        return self.q_net(observation)
torch.onnx.export(OnnxableQ(model.q_net), torch.zeros(1, 4), out + "/sb3_dqn.onnx", opset_version=17,
                  input_names=["input"], dynamic_axes={"input": {0: "batch"}}, dynamo=False)
obs = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32)
with torch.no_grad():
    q = model.q_net(torch.as_tensor(obs)).numpy()
np.savez(out + "/probe.npz", obs=obs, q=q)
"""


def _import(*args, env=ENV):
    return rlfleet("import-teacher", *args, env=env, timeout=600)


def _ok(done):
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def sb3_teacher(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sb3")
    done = subprocess.run([sys.executable, "-c", _SB3_SCRIPT, str(folder)], capture_output=True, text=True,
                          timeout=600, cwd=ROOT)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return folder


def test_sb3_dqn_exported_to_onnx_reincarnates_into_an_rlfleet_student(sb3_teacher, tmp_path):
    """The teacher generates its data by acting, then a QDagger student (another width) learns from it."""
    teacher = tmp_path / "teacher"
    done = _ok(_import("--env", "CartPole-v1", "--model", sb3_teacher / "sb3_dqn.onnx", "--out", teacher,
                       "--generate-steps", 2000, "--eval-episodes", 3))  # fmt: skip
    assert "rlfleet up --algo qdagger --env CartPole-v1 --teacher" in done.stdout
    run = json.loads((teacher / "run.json").read_text())
    assert run["algo"] == "imported" and run["model"]["format"] == "onnx"
    assert run["data"]["generated_by_teacher"] == 2000 and run["config"]["n_step"] == 3
    assert json.loads((teacher / "summary.json").read_text())["final_eval_episodes"] == 3
    probe = np.load(sb3_teacher / "probe.npz")
    model = load_model(str(teacher / "model.onnx"), env_spec("CartPole-v1"))
    np.testing.assert_allclose(model.numpy(probe["obs"]), probe["q"], rtol=1e-5, atol=1e-5)

    student = tmp_path / "student"
    settings = ["--set", "offline_steps=200", "--set", "hidden=[64,64]"]  # SB3's network is one layer of 32
    out = rlfleet("up", "--algo", "qdagger", "--env", "CartPole-v1", "--teacher", teacher, "--total-steps", 1500,
                  "--logdir", student, *settings, timeout=600)  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    said = out.stdout + out.stderr
    assert "offline pretraining done (200 gradient steps)" in said and f"teacher {teacher} evaluates at" in said
    summary = json.loads((student / "summary.json").read_text())
    assert summary["algo"] == "qdagger" and summary["learner_steps"] > 200
    rows = [json.loads(line) for line in (student / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("distillation_loss") for r in rows)


def test_savedmodel_of_rlfleet_export_and_its_runs_replay_teach_a_dqfd_student(tmp_path):
    """`rlfleet export` of a DQN run as the model, the run's replay checkpoint as the data."""
    dqn = tmp_path / "dqn"
    _ok(rlfleet("up", "--algo", "dqn", "--env", "CartPole-v1", "--total-steps", 1500, "--logdir", dqn, timeout=600))
    exported = tmp_path / "export"
    _ok(rlfleet("export", dqn, "--out", exported, timeout=300))
    teacher = tmp_path / "teacher"
    _ok(_import("--env", "CartPole-v1", "--model", exported, "--data", dqn, "--out", teacher, "--eval-episodes", 0))
    run = json.loads((teacher / "run.json").read_text())
    assert run["model"]["format"] == "savedmodel" and run["data"]["run"] == str(dqn)
    assert (
        sorted(p.name for p in (teacher / "replay").iterdir())
        == sorted(p.name for p in (dqn / "replay").iterdir() if p.name.startswith("ckpt-"))[-1:]
    )

    spec = env_spec("CartPole-v1")
    obs = np.random.default_rng(1).normal(size=(8, 4)).astype(np.float32)
    import tensorflow as tf

    served = tf.saved_model.load(str(exported)).signatures["serving_default"](observations=tf.constant(obs))
    model = load_model(str(teacher / "model"), spec)
    np.testing.assert_allclose(model.numpy(obs), served["q_values"].numpy(), rtol=1e-6)
    np.testing.assert_allclose(model(tf.constant(obs)).numpy(), served["q_values"].numpy(), rtol=1e-6)

    student = tmp_path / "student"
    # The margin's weight held at 1 (the score window is never full): the teacher's term in every step.
    held = ("--set", "offline_steps=100", "--set", "distillation_score_episodes=1000", "--report-interval", 1)
    out = rlfleet("up", "--algo", "dqfd", "--env", "CartPole-v1", "--teacher", teacher, "--total-steps", 1000,
                  "--logdir", student, *held, timeout=600)  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = [json.loads(line) for line in (student / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "margin_loss" in r]  # the rows with learner metrics
    assert rows and all(r["margin_weight"] == 1.0 and r["margin_loss"] >= 0 for r in rows), rows


def _minari_dataset(root, env_id: str, dataset_id: str, episodes: int):
    """A Minari dataset of a random policy's episodes of `env_id` under `root`; returns the episodes as arrays."""
    import gymnasium as gym
    import minari
    from minari.data_collector import EpisodeBuffer

    env, rng, kept, buffers = gym.make(env_id), np.random.default_rng(0), [], []
    for i in range(episodes):
        obs, _ = env.reset(seed=i)
        o, a, r, te, tr = [obs], [], [], [], []
        while not (te and (te[-1] or tr[-1])):
            action = int(rng.integers(env.action_space.n))
            obs, reward, terminated, truncated, _ = env.step(action)
            o, a, r, te, tr = o + [obs], a + [action], r + [reward], te + [terminated], tr + [truncated]
        buffers.append(EpisodeBuffer(id=i, observations=np.array(o), actions=np.array(a), rewards=r,
                                     terminations=te, truncations=tr))  # fmt: skip
        kept.append((np.array(o, np.float32), np.array(a), np.array(r, np.float32), np.array(te)))
    os.environ["MINARI_DATASETS_PATH"] = str(root)
    try:
        minari.create_dataset_from_buffers(dataset_id, buffers, env=env_id, algorithm_name="random")
    finally:
        del os.environ["MINARI_DATASETS_PATH"]
    return kept


def test_minari_dataset_becomes_the_teachers_replay_transition_for_transition(tmp_path):
    episodes = _minari_dataset(tmp_path / "minari", "CartPole-v1", "cartpole/random-v0", 20)
    teacher = tmp_path / "teacher"
    env = dict(ENV, MINARI_DATASETS_PATH=str(tmp_path / "minari"))
    model = _onnx_model(tmp_path / "q.onnx", 4, 2)
    _ok(_import("--env", "CartPole-v1", "--model", model, "--data", "minari:cartpole/random-v0",
                "--out", teacher, "--eval-episodes", 0, env=env))  # fmt: skip
    total = sum(len(a) for _, a, _, _ in episodes)
    run = json.loads((teacher / "run.json").read_text())
    assert run["data"] == dict(minari="cartpole/random-v0", episodes=20, transitions=total)

    # Every item read back is the dataset's transition at its step: action, the n rewards, and the observation
    # n steps later (or the episode's end within them).
    n = run["config"]["n_step"]
    by_obs = {o[t].tobytes(): (o, a, r, te, t) for o, a, r, te in episodes for t in range(len(a))}
    got, items = _read_back(teacher / "replay", tmp_path, n, 300)
    assert items == total
    for i in range(300):
        o, a, r, te, t = by_obs[got["observation"][i].tobytes()]
        assert got["action"][i] == a[t]
        steps = min(n, len(a) - t)
        np.testing.assert_allclose(got["reward"][i][:steps], r[t : t + steps])
        assert got["done"][i][: steps - 1].sum() == 0
        if t + n < len(a):
            np.testing.assert_array_equal(got["next_observation"][i], o[t + n])
        else:  # the episode ends inside the window: terminated (CartPole) means done at its last step
            assert got["done"][i][steps - 1] == 1.0 and te[-1]


def _onnx_model(path, inputs: int, outputs: int | None, name="q", batch="N"):
    """A linear ONNX model observations [batch, inputs] -> [batch, outputs] (None: [batch], one value per
    observation); `batch` "N": any batch size."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    width = outputs or 1
    weights = numpy_helper.from_array(np.ones((inputs, width), np.float32), "w")
    nodes = [helper.make_node("MatMul", ["obs", "w"], [name if outputs else "y"])]
    out_shape = [batch, width]
    if outputs is None:
        nodes.append(helper.make_node("Squeeze", ["y", "axes"], [name]))
        weights_axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
        out_shape = [batch]
    graph = helper.make_graph(
        nodes,
        "q",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, [batch, inputs])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, out_shape)],
        [weights] + ([weights_axes] if outputs is None else []),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize(
    "case, expect",
    [
        ("observations", "takes inputs of shape ['N', 6], but CartPole-v1's observations are [4]"),
        ("actions", "outputs shape [2, 3], not one value per action ([2, 2]: CartPole-v1 has 2 actions)"),
        ("one value", "outputs shape [2], not one value per action"),
        ("not a model", "not an ONNX model onnxruntime can load"),
        ("other env's dataset", "a dataset of Acrobot-v1, not of CartPole-v1"),
        ("no data", "give the teacher's data as --data"),
        ("continuous env", "its actions are continuous"),
        ("another env's run", "a run on Acrobot-v1; give a run on CartPole-v1"),
        ("fixed batch", "its input has a fixed batch size of 1; export it with a dynamic batch axis"),
        ("for jsrl", "--algo jsrl: its teacher acts on the actors"),
    ],
)
def test_bad_teachers_are_refused_with_exit_2_and_nothing_written(case, expect, tmp_path):
    good = _onnx_model(tmp_path / "good.onnx", 4, 2)
    env_id, model, data = "CartPole-v1", good, ["--generate-steps", 100]
    env = ENV
    if case == "observations":
        model = _onnx_model(tmp_path / "six.onnx", 6, 2)
    elif case == "actions":
        model = _onnx_model(tmp_path / "three.onnx", 4, 3)
    elif case == "one value":
        model = _onnx_model(tmp_path / "scalar.onnx", 4, None)
    elif case == "not a model":
        model = tmp_path / "notes.onnx"
        model.write_text("not a model")
    elif case == "other env's dataset":
        _minari_dataset(tmp_path / "minari", "Acrobot-v1", "acrobot/random-v0", 1)
        env, data = dict(ENV, MINARI_DATASETS_PATH=str(tmp_path / "minari")), ["--data", "minari:acrobot/random-v0"]
    elif case == "no data":
        data = []
    elif case == "continuous env":
        env_id = "Pendulum-v1"
    elif case == "fixed batch":
        model = _onnx_model(tmp_path / "fixed.onnx", 4, 2, batch=1)
    elif case == "for jsrl":
        data = [*data, "--algo", "jsrl"]
    elif case == "another env's run":
        other = tmp_path / "acrobot-run"
        other.mkdir()
        (other / "run.json").write_text(json.dumps(dict(algo="dqn", env_id="Acrobot-v1")))
        data = ["--data", other]
    out = tmp_path / "teacher"
    done = _import("--env", env_id, "--model", model, "--out", out, *data, env=env)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert expect in done.stderr and "Traceback" not in done.stderr
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".rlfleet-teacher")]


def _read_back(replay_root, tmp_path, n_step: int, transitions: int):
    """`transitions` transitions sampled from a teacher's replay checkpoint as the learner decodes them, and the
    table's size in items."""
    work = tmp_path / "copy"
    table = reverb.Table(TABLE, reverb.selectors.Uniform(), reverb.selectors.Fifo(), 10**6,
                         reverb.rate_limiters.MinSize(1))  # fmt: skip
    copy = open_teacher_replay(str(replay_root), str(work))
    server = reverb.Server([table], checkpointer=checkpointer(str(work), copy))
    try:
        size = reverb.Client(f"localhost:{server.port}").server_info()[TABLE].current_size
        minibatches = batches(f"localhost:{server.port}", transitions, n_step, 1)
        got = {k: v.numpy()[0] for k, v in next(minibatches).items()}
    finally:
        server.stop()
    return got, size


def test_generated_data_is_one_item_per_transition_and_never_bootstraps_from_padding(tmp_path):
    """The teacher's own acting as data: items of several envs (as the student's actors would write them); the
    episodes still running when the data ends are cut there, so no transition trains on the padding after it."""
    teacher = tmp_path / "teacher"
    _ok(_import("--env", "CartPole-v1", "--model", _onnx_model(tmp_path / "q.onnx", 4, 2), "--generate-steps", 400,
                "--out", teacher, "--eval-episodes", 0))  # fmt: skip
    run = json.loads((teacher / "run.json").read_text())
    assert run["data"]["generated_by_teacher"] == 400
    got, items = _read_back(teacher / "replay", tmp_path, run["config"]["n_step"], 512)
    assert items * 8 == 400  # 8 envs to an item (the qdagger CartPole batch of 64 reads 8 items)
    trained = (got["valid"] == 1) & (got["done"].max(1) == 0)
    assert trained.sum() > 100
    assert not np.any(np.all(got["next_observation"][trained] == 0, axis=1))


def test_students_an_imported_teacher_cannot_teach_are_refused_before_anything_starts(tmp_path):
    """JSRL's teacher acts on the actors, which run only rlfleet's Q-networks, and a student reads the teacher's
    items with its own n_step: a model-file teacher for JSRL, and a student of another n_step, are refused with
    the reason, exit 2, and no run directory is made. The folder is a teacher, not a run (eval refuses it), and
    can be the data of another import, whose printed command carries the n_step its items need."""
    teacher = tmp_path / "teacher"
    _ok(_import("--env", "CartPole-v1", "--model", _onnx_model(tmp_path / "q.onnx", 4, 2), "--generate-steps", 64,
                "--out", teacher, "--eval-episodes", 0))  # fmt: skip
    refusals = [
        (("--algo", "jsrl"), "its Q-network is a model file (onnx), which the actors cannot run"),
        (("--algo", "qdagger", "--set", "n_step=1"), "its replay items hold 3-step returns, and the student's n_step "
         "is 1; give the student --set n_step=3"),
    ]  # fmt: skip
    for args, expect in refusals:
        logdir = tmp_path / "student"
        done = rlfleet("up", *args, "--env", "CartPole-v1", "--teacher", teacher, "--total-steps", 1000,
                       "--logdir", logdir, timeout=300)  # fmt: skip
        assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
        assert expect in done.stderr and "Traceback" not in done.stderr and not logdir.exists(), done.stderr
    done = rlfleet("eval", teacher, timeout=300)
    assert done.returncode == 2 and "a teacher folder (`rlfleet import-teacher`), not a run" in done.stderr
    again = tmp_path / "again"
    done = _ok(_import("--env", "CartPole-v1", "--model", teacher / "model.onnx", "--data", teacher, "--out", again,
                       "--eval-episodes", 0))  # fmt: skip
    assert json.loads((again / "run.json").read_text())["data"]["run"] == str(teacher)
    one_step = tmp_path / "one-step"
    done = _ok(_import("--env", "CartPole-v1", "--model", teacher / "model.onnx", "--generate-steps", 16,
                       "--n-step", 1, "--out", one_step, "--eval-episodes", 0))  # fmt: skip
    assert f"--teacher {one_step} --logdir RUN_DIR --set n_step=1" in done.stdout


def test_import_stopped_by_sigterm_leaves_nothing(tmp_path):
    """SIGTERM while the teacher generates its data: exit 130, no teacher folder, no staging folder."""
    out = tmp_path / "teacher"
    log = open(tmp_path / "import.log", "wb")
    cmd = [sys.executable, "-m", "rlfleet.deploy.cli", "import-teacher", "--env", "CartPole-v1", "--model",
           str(_onnx_model(tmp_path / "q.onnx", 4, 2)), "--generate-steps", "100000000", "--out", str(out)]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not any(p.name.startswith(".rlfleet-teacher") for p in tmp_path.iterdir()):
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "import.log").read_text()
            time.sleep(0.2)
        time.sleep(3)  # into the teacher's acting
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 130, (tmp_path / "import.log").read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    assert "stopped; nothing was left at --out" in (tmp_path / "import.log").read_text()
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".rlfleet-teacher")]
