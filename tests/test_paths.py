"""Checkpoints whatever the folder is named, whatever the clock says, and whatever damage the newest took.

Learner checkpoints (`rlfleet.learner.checkpoints`) and replay checkpoints (`rlfleet.replay.checkpoints`) are
saved, pruned and restored in folders named with every class of printable ASCII character and with non-ASCII
letters; the newest checkpoint is damaged in the ways a crash or a bad disk damages it; replay checkpoints are
written by servers in time zones far apart (Reverb names them by the local time). Real Reverb servers on
loopback; the cluster-level resume is in test_learning.py.
"""

import json
import os
import re
import string
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import reverb
import tensorflow as tf

from rlfleet.learner.checkpoints import CheckpointError, CheckpointStore, checkpoint_numbers, restore_newest
from rlfleet.replay import checkpoints as replay_ckpt

# One folder name per class of character a file name may hold: every punctuation mark (the characters
# TensorFlow and Reverb read as patterns among them), white space, digits and letters, non-ASCII letters, and a
# name that starts like an option.
AWKWARD = [
    "".join(c for c in string.punctuation if c != "/"),
    "two words\tand a tab",
    "run[0-9]*?",
    "back\\slash{a,b}",
    "ünïcødé Ωμέγα 漢字",
    "-dash ~tilde",
    string.ascii_letters + string.digits,
]
PROGRESS = dict(next_actor_id=0, wall_seconds=1.0, actor_env_steps={})


def _truncate(path):
    with open(path, "r+b") as f:
        f.truncate(max(1, os.path.getsize(path) // 3))


def _empty(path):  # a crash before the data reached the disk
    with open(path, "r+b") as f:
        f.truncate(0)


def _zero(path):
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.write(b"\0" * size)


DAMAGE = {"truncated": _truncate, "emptied": _empty, "zeroed": _zero, "deleted": os.remove}


@pytest.mark.parametrize("name", AWKWARD)
def test_learner_checkpoints_save_prune_and_restore_in_any_folder(tmp_path, name):
    folder = str(tmp_path / name / "checkpoints")
    variable = tf.Variable(np.zeros(64, np.float32))
    store = CheckpointStore(folder, tf.train.Checkpoint(v=variable), keep=3)
    for i in range(1, 6):
        variable.assign(np.full(64, i, np.float32))
        assert store.save(dict(PROGRESS, wall_seconds=float(i))) == os.path.join(folder, f"ckpt-{i}")
    assert checkpoint_numbers(folder) == [5, 4, 3]  # pruned with their progress records
    assert sorted(n for n in os.listdir(folder) if n.endswith(".progress.json")) == [
        f"ckpt-{i}.progress.json" for i in (3, 4, 5)
    ]
    variable.assign(np.zeros(64, np.float32))
    assert restore_newest(folder, tf.train.Checkpoint(v=variable)) == (os.path.join(folder, "ckpt-5"), [])
    assert variable.numpy()[0] == 5
    # TensorFlow's own reader still finds the newest through the index file (TensorBoard, notebooks).
    if not set(name) & set("*?[]\\{}"):
        assert tf.train.latest_checkpoint(folder) == os.path.join(folder, "ckpt-5")


@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize("part", ["data", "index", "progress"])
def test_a_damaged_newest_learner_checkpoint_falls_back_to_the_older_one(tmp_path, damage, part):
    folder = str(tmp_path / "run[1] ü" / "checkpoints")
    variable = tf.Variable(np.zeros(256, np.float32))
    store = CheckpointStore(folder, tf.train.Checkpoint(v=variable), keep=3)
    for i in (1, 2):
        variable.assign(np.full(256, i, np.float32))
        store.save(PROGRESS)
    suffix = {"data": ".data-00000-of-00001", "index": ".index", "progress": ".progress.json"}[part]
    DAMAGE[damage](os.path.join(folder, "ckpt-2" + suffix))
    variable.assign(np.zeros(256, np.float32))
    if part == "progress" and damage == "deleted":  # a checkpoint without a record is an old one, not a damaged one
        assert restore_newest(folder, tf.train.Checkpoint(v=variable))[0].endswith("ckpt-2")
        return
    path, skipped = restore_newest(folder, tf.train.Checkpoint(v=variable))
    assert path == os.path.join(folder, "ckpt-1"), skipped
    assert len(skipped) == 1 and skipped[0].startswith("ckpt-2"), skipped
    assert "it cannot be read" not in skipped[0], skipped  # the damage is said in words, not only as an error
    assert variable.numpy()[0] == 1
    # The next save goes above the damaged one, so that it is the newest again.
    assert store.save(PROGRESS).endswith("ckpt-3")
    for number in (1, 3):
        DAMAGE["truncated"](os.path.join(folder, f"ckpt-{number}.data-00000-of-00001"))
    with pytest.raises(CheckpointError, match="can be read: .*ckpt-3.*ckpt-1"):
        restore_newest(folder, tf.train.Checkpoint(v=variable))


def _table():
    return reverb.Table("t", reverb.selectors.Fifo(), reverb.selectors.Fifo(), 10_000, reverb.rate_limiters.MinSize(1))


def _insert(server, start, count):
    client = reverb.Client(f"localhost:{server.port}")
    with client.trajectory_writer(num_keep_alive_refs=1) as writer:
        for v in range(start, start + count):
            writer.append({"x": np.full(16, v, np.float32)})
            writer.create_item("t", 1.0, {"x": writer.history["x"][-1:]})
    return client


def _server(root):
    """A Reverb server on `root` as `rlfleet replay` starts one: finished checkpoints moved out of staging, the
    newest readable one restored, the damaged ones moved aside, the rest pruned."""
    replay_ckpt.promote(root, then_prune=False)
    restoring, skipped, damaged = replay_ckpt.usable_checkpoint(root)
    replay_ckpt.quarantine(damaged)
    replay_ckpt.prune(root, protect=restoring)
    return reverb.Server([_table()], checkpointer=replay_ckpt.checkpointer(root, restore_from=restoring)), skipped


@pytest.mark.parametrize("name", AWKWARD)
def test_replay_checkpoints_save_prune_and_restore_in_any_folder(tmp_path, name):
    root = str(tmp_path / name / "replay")
    os.makedirs(root)
    server, _ = _server(root)
    for i in range(3):
        client = _insert(server, 10 * i, 10)
        path = replay_ckpt.checkpoint_replay(f"localhost:{server.port}", 60, root=root)
        assert path == os.path.join(root, f"ckpt-{i + 1}"), path
    server.stop()
    assert sorted(n for n in os.listdir(root) if n != replay_ckpt.STAGING) == ["ckpt-2", "ckpt-3"]
    assert os.listdir(os.path.join(root, replay_ckpt.STAGING)) == []
    server, _ = _server(root)
    client = reverb.Client(f"localhost:{server.port}")
    assert client.server_info()["t"].current_size == 30
    server.stop()


@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize("part", replay_ckpt.DATA_FILES)
def test_a_damaged_newest_replay_checkpoint_is_reported_and_the_older_one_restored(tmp_path, damage, part):
    root = str(tmp_path / "replay [x]")
    os.makedirs(root)
    server, _ = _server(root)
    _insert(server, 0, 20)
    replay_ckpt.checkpoint_replay(f"localhost:{server.port}", 60, root=root)
    _insert(server, 20, 20)
    newest = replay_ckpt.checkpoint_replay(f"localhost:{server.port}", 60, root=root)
    server.stop()
    DAMAGE[damage](os.path.join(newest, part))
    server, skipped = _server(root)
    assert len(skipped) == 1 and newest in skipped[0] and part in skipped[0], skipped
    assert reverb.Client(f"localhost:{server.port}").server_info()["t"].current_size == 20
    # The damaged one is moved aside: it neither counts among the kept two nor crowds out the restored one.
    assert os.path.isdir(os.path.join(root, "damaged-ckpt-2"))
    assert replay_ckpt.checkpoints_newest_first(root) == [os.path.join(root, "ckpt-1")]
    path = replay_ckpt.checkpoint_replay(f"localhost:{server.port}", 60, root=root)
    assert path == os.path.join(root, "ckpt-2")
    assert replay_ckpt.checkpoints_newest_first(root) == [path, os.path.join(root, "ckpt-1")]
    server.stop()


_TZ_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np, reverb
    from rlfleet.replay import checkpoints as c
    root, start = sys.argv[1], int(sys.argv[2])
    c.promote(root)
    restoring, _, _ = c.usable_checkpoint(root)
    table = reverb.Table("t", reverb.selectors.Fifo(), reverb.selectors.Fifo(), 10000, reverb.rate_limiters.MinSize(1))
    server = reverb.Server([table], checkpointer=c.checkpointer(root, restore_from=restoring))
    client = reverb.Client(f"localhost:{server.port}")
    before = client.server_info()["t"].current_size
    with client.trajectory_writer(num_keep_alive_refs=1) as w:
        for v in range(start, start + 10):
            w.append({"x": np.full(4, v, np.float32)})
            w.create_item("t", 1.0, {"x": w.history["x"][-1:]})
    path = c.checkpoint_replay(f"localhost:{server.port}", 60, root=root)
    server.stop()
    print(json.dumps(dict(before=int(before), path=path)))
    """
)


@pytest.mark.slow
def test_replay_checkpoints_do_not_depend_on_the_clock_or_time_zone(tmp_path):
    # Reverb names a checkpoint by the local time: a server 26 hours "behind" the one before it writes a name
    # that sorts first, which Reverb's own pruning (it keeps the name that sorts last) would delete at once.
    root = str(tmp_path / "replay")
    os.makedirs(root)
    sizes = []
    for i, zone in enumerate(["Pacific/Kiritimati", "Etc/GMT+12", "UTC", "Etc/GMT+12"]):
        env = dict(os.environ, TZ=zone)
        out = subprocess.run(
            [sys.executable, "-c", _TZ_SCRIPT, root, str(10 * i)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        result = json.loads(out.stdout.strip().splitlines()[-1])
        sizes.append(result["before"])
        assert result["path"] == os.path.join(root, f"ckpt-{i + 1}"), result
    assert sizes == [0, 10, 20, 30]


@pytest.fixture
def small_disk(tmp_path):
    """A 600 kB tmpfs mounted for the test (root only; skipped where mounting is not allowed)."""
    mount_point = tmp_path / "small disk [1]"
    mount_point.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = ["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", str(mount_point)]
    mounted = subprocess.run(mount, capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode()[-200:]}")
    try:
        yield str(mount_point)
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


@pytest.mark.root
def test_a_full_disk_is_a_clear_error_and_the_last_checkpoint_stays(small_disk):
    from rlfleet.common.files import StorageError

    folder = os.path.join(small_disk, "checkpoints")
    variable = tf.Variable(np.ones(100_000, np.float32))  # 400 kB a checkpoint: one fits, two do not
    store = CheckpointStore(folder, tf.train.Checkpoint(v=variable), keep=3)
    store.save(PROGRESS)
    variable.assign(np.full(100_000, 2, np.float32))
    with pytest.raises(
        StorageError, match=r"cannot write a learner checkpoint to .*small disk \[1\].*disk is full"
    ) as e:
        store.save(PROGRESS)
    assert re.search(r"\(0\.\d MB free there; it needs about 0\.4 MB\)", str(e.value)), e.value  # the last one's size
    assert sorted(os.listdir(folder)) == [
        "checkpoint",
        "ckpt-1.data-00000-of-00001",
        "ckpt-1.index",
        "ckpt-1.progress.json",
    ]
    assert store.latest == os.path.join(folder, "ckpt-1")
    assert restore_newest(folder, tf.train.Checkpoint(v=variable))[0] == os.path.join(folder, "ckpt-1")
    assert variable.numpy()[0] == 1


@pytest.mark.slow
@pytest.mark.root
def test_an_unwritable_run_directory_is_refused_by_every_service(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a read-only tmpfs needs root")
    read_only = tmp_path / "read-only [ro]"
    read_only.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(read_only)]
    mounted = subprocess.run(mount, capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode()[-200:]}")
    from helpers import rlfleet

    try:
        dqn = ("--algo", "dqn", "--env", "CartPole-v1")
        run = read_only / "run"
        for args in (
            ("up", *dqn, "--total-steps", "1000", "--logdir", run),
            ("learner", *dqn, "--replay", "127.0.0.1:1", "--logdir", run),
            ("replay", *dqn, "--port", "0", "--checkpoint-dir", run / "replay"),
            ("replay", *dqn, "--port", "0", "--settings-out", run / "settings.json"),
        ):
            out = rlfleet(*args, timeout=180)
            assert out.returncode == 2, (args, out.stdout[-2000:], out.stderr[-2000:])
            assert "rlfleet: error: cannot write" in out.stderr and "Read-only file system" in out.stderr, out.stderr
            assert "Traceback" not in out.stderr, out.stderr
    finally:
        subprocess.run(["umount", "-l", str(read_only)], check=False)


class _Agent:
    """What `ProgressCheckpoints` uses of an agent: its variables and the sync hook."""

    def __init__(self):
        self.w = tf.Variable(np.zeros(8, np.float32))

    def checkpoint_items(self):
        return dict(w=self.w)

    def sync_to_checkpoint(self):
        pass


def test_the_best_checkpoint_is_one_of_its_own_beside_the_run_checkpoints(tmp_path):
    from rlfleet.learner.progress import COUNTERS, ProgressCheckpoints, read_best

    logdir = str(tmp_path / "run [best] ü")
    agent = _Agent()
    checkpoints = ProgressCheckpoints(agent, logdir)
    count = dict.fromkeys(COUNTERS, 0)
    actors = dict(next_actor_id=1, actor_env_steps={0: 10})
    assert read_best(logdir) is None
    for i, mean in enumerate([5.0, 9.0, 7.0], start=1):
        agent.w.assign(np.full(8, i, np.float32))
        count["env_steps"] = 1000 * i
        checkpoints.save(count, actors, float(i))
        if mean == 9.0:
            best_path = checkpoints.save_best(count, actors, float(i), mean, count["env_steps"])
    best = read_best(logdir)
    assert best == dict(eval_return_mean=9.0, eval_env_steps=2000, checkpoint=best_path), best
    assert checkpoint_numbers(os.path.join(logdir, "checkpoints")) == [3, 2, 1]  # the run's own, untouched
    restored = _Agent()  # the network of that evaluation, read back as a resume reads checkpoints
    assert restore_newest(os.path.dirname(best_path), tf.train.Checkpoint(w=restored.w)) == (best_path, [])
    assert restored.w.numpy()[0] == 2
    # Only the newest best is kept; a record that cannot be read is no best (the next evaluation becomes it).
    checkpoints.save_best(count, actors, 4.0, 11.0, 4000)
    assert checkpoint_numbers(os.path.join(logdir, "checkpoints", "best")) == [2]
    with open(read_best(logdir)["checkpoint"] + ".progress.json", "w") as f:
        f.write("{")
    assert read_best(logdir) is None


@pytest.mark.slow
def test_a_filesystem_that_does_not_fsync_folders_runs_with_one_warning(tmp_path):
    """A DQN run (learner and replay checkpoints, atomic files) on a filesystem that refuses to fsync folders, as
    some network and FUSE mounts do: here a `sitecustomize` shim first on the processes' PYTHONPATH
    (tests/fsync_shim) that makes os.fsync of a folder raise EINVAL. The run finishes, and resumes, with a warning
    per process and filesystem in place of an error."""
    from helpers import ENV, rlfleet

    shim = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fsync_shim")
    env = dict(ENV, PYTHONPATH=os.pathsep.join(p for p in (shim, ENV.get("PYTHONPATH")) if p))
    run = tmp_path / "run"
    args = ("--algo", "dqn", "--env", "CartPole-v1", "--set", "min_replay_size=200")
    out = rlfleet("up", *args, "--total-steps", 2000, "--logdir", run, env=env, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "does not fsync folders (Invalid argument)" in out.stdout + out.stderr
    assert json.loads((run / "summary.json").read_text())["completed"]
    again = rlfleet("up", "--resume", run, "--total-steps", 3000, env=env, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert json.loads((run / "summary.json").read_text())["env_steps"] >= 3000


def test_a_path_whose_name_is_not_utf8_is_refused_before_anything_starts(tmp_path):
    """A folder named in another encoding (here Latin-1's ÿ, byte 0xff): TensorFlow and Reverb read paths as UTF-8,
    so every command refuses it at its option, with exit 2, before it starts or writes anything."""
    from helpers import rlfleet

    bad = os.fsdecode(os.fsencode(str(tmp_path)) + b"/run-\xff")
    up = rlfleet("up", "--algo", "ppo", "--env", "Pendulum-v1", "--total-steps", 1000, "--logdir", bad, timeout=120)
    replay = rlfleet("replay", "--algo", "dqn", "--env", "CartPole-v1", "--port", 0, "--checkpoint-dir", bad,
                     timeout=120)  # fmt: skip
    for out, option in ((up, "--logdir"), (replay, "--checkpoint-dir")):
        assert out.returncode == 2, out.stdout + out.stderr
        assert f"Invalid value for '{option}'" in out.stderr and "is not a valid UTF-8 name" in out.stderr
        assert "\\xff" in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert os.listdir(tmp_path) == []  # nothing written
