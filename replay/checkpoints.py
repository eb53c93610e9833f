"""Reverb replay checkpoints: where a run keeps them, and reopening a teacher's replay read-only.

A DQN / QDagger replay server started with a checkpoint directory (`rlfleet up`
uses RUN_DIR/replay) loads the latest checkpoint there when it starts, and
writes a new one when asked (`checkpoint_replay`: the learner does it at the
end of a run, `rlfleet replay-checkpoint` on request).

Restoring a Reverb checkpoint brings back each table's items together with
its sampler, remover and rate limiter (counters included), replacing the
tables passed to the new server. A teacher's table comes back with the
`SampleToInsertRatio` limiter of its DQN run, which blocks sampling as soon as
nobody inserts; `open_teacher_replay` therefore makes a copy of the checkpoint
whose table rate limiter admits every sample (as Reverb's `MinSize(1)` does:
cursor bounds at ±DBL_MAX), hard-linking the chunk and item files and
rewriting only the small table file. The table file holds Reverb's
`PriorityTableCheckpoint` messages (reverb/cc/checkpointing/checkpoint.proto);
`_table_message` declares just the fields changed here and keeps all others
as unknown fields, which protobuf writes back unchanged.
"""

from __future__ import annotations

import os
import shutil
import sys

import reverb
import tensorflow as tf
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

DONE = "DONE"  # Reverb writes this file last into a complete checkpoint
TABLES_FILE = "tables.tfrecord"  # ZLIB-compressed TFRecord of PriorityTableCheckpoint messages
REPLAY_SUBDIR = "replay"  # a run directory's Reverb checkpoint root


class ReplayCheckpointError(ValueError):
    """A replay checkpoint is missing or unreadable; the message says which and what to do."""


def latest_checkpoint(root: str) -> str | None:
    """The newest complete Reverb checkpoint (a subdirectory holding DONE) under `root`, or None."""
    if not os.path.isdir(root):
        return None
    done = sorted(d for d in os.listdir(root) if os.path.exists(os.path.join(root, d, DONE)))
    return os.path.join(root, done[-1]) if done else None


def checkpointer(root: str):
    """Reverb checkpointer writing under `root`; at start it loads the latest checkpoint of `root`."""
    from reverb.platform import checkpointers_lib

    os.makedirs(root, exist_ok=True)
    return checkpointers_lib.DefaultCheckpointer(root)


def checkpoint_replay(address: str, timeout_s: float = 600.0) -> str:
    """Asks the Reverb server at `address` to write a checkpoint; returns its directory.

    Raises:
        ReplayCheckpointError: the server is unreachable or the checkpoint failed.
    """
    try:
        return reverb.Client(address).checkpoint()
    except Exception as e:
        raise ReplayCheckpointError(f"replay server {address} could not write a checkpoint: {e}") from None


def restored_differences(requested: dict, restored: dict) -> list[str]:
    """What differs between the tables a replay server was started with and those a checkpoint restored.

    Args:
        requested / restored: {table name: reverb TableInfo} (`reverb.Table.info` before the server started;
            `reverb.Client.server_info()` after it restored its checkpoint).
    Returns:
        one line per difference (table names, item signature, capacity, rate limiter, sampler, remover);
        empty when they match.
    """
    out = []
    if set(requested) != set(restored):
        return [f"tables {sorted(restored)} in the checkpoint, {sorted(requested)} asked"]

    def limiter(t):
        r = t.rate_limiter_info
        return dict(
            samples_per_insert=r.samples_per_insert,
            min_size_to_sample=r.min_size_to_sample,
            min_diff=r.min_diff,
            max_diff=r.max_diff,
        )

    def signature(t):
        import tree

        flat = tree.flatten_with_path(t.signature) if t.signature is not None else []
        return {"/".join(map(str, path)): (tuple(s.shape), s.dtype.name) for path, s in flat}

    for name in sorted(requested):
        want, got = requested[name], restored[name]
        for what, read in (
            ("item signature", signature),
            ("max_size", lambda t: t.max_size),
            ("rate limiter", limiter),
            ("sampler", lambda t: str(t.sampler_options).strip()),
            ("remover", lambda t: str(t.remover_options).strip()),
        ):
            if read(want) != read(got):
                out.append(f"table {name}: {what} {read(got)} in the checkpoint, {read(want)} asked")
    return out


def tables_changed(client, checkpoint: str | None) -> bool:
    """True when the server behind `client` inserted or sampled since `checkpoint` (None: never checkpointed)."""
    info = client.server_info()
    now = {
        name: (t.rate_limiter_info.insert_stats.completed, t.rate_limiter_info.sample_stats.completed)
        for name, t in info.items()
    }
    if checkpoint is None:
        return any(inserts for inserts, _ in now.values())
    saved = {t.table_name: (t.rate_limiter.insert_count, t.rate_limiter.sample_count) for t in read_tables(checkpoint)}
    return now != saved


def _table_message():
    f = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(
        name="rlfleet_reverb_table_checkpoint.proto", package="rlfleet.reverb_checkpoint", syntax="proto3"
    )
    limiter = fdp.message_type.add(name="RateLimiterCheckpoint")
    for name, number, kind in (
        ("samples_per_insert", 2, f.TYPE_DOUBLE),
        ("min_diff", 3, f.TYPE_DOUBLE),
        ("max_diff", 4, f.TYPE_DOUBLE),
        ("min_size_to_sample", 5, f.TYPE_INT64),
        ("sample_count", 6, f.TYPE_INT64),
        ("insert_count", 7, f.TYPE_INT64),
    ):
        limiter.field.add(name=name, number=number, type=kind, label=f.LABEL_OPTIONAL)
    table = fdp.message_type.add(name="PriorityTableCheckpoint")
    table.field.add(name="table_name", number=1, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    table.field.add(
        name="rate_limiter",
        number=3,
        type=f.TYPE_MESSAGE,
        label=f.LABEL_OPTIONAL,
        type_name=".rlfleet.reverb_checkpoint.RateLimiterCheckpoint",
    )
    table.field.add(name="max_size", number=6, type=f.TYPE_INT64, label=f.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName("rlfleet.reverb_checkpoint.PriorityTableCheckpoint")
    )


def read_tables(checkpoint: str) -> list:
    """The table records of a Reverb checkpoint (fields table_name, max_size, rate_limiter)."""
    cls = _table_message()
    path = os.path.join(checkpoint, TABLES_FILE)
    try:
        return [cls.FromString(r.numpy()) for r in tf.data.TFRecordDataset(path, compression_type="ZLIB")]
    except (tf.errors.OpError, OSError) as e:
        raise ReplayCheckpointError(f"{path} is not a readable Reverb checkpoint: {e}") from None


def open_teacher_replay(teacher_root: str, work_root: str) -> str:
    """Makes a read-only-use copy of the latest checkpoint under `teacher_root` in `work_root`.

    The copy's tables keep their items, sampler, remover and counters; their
    rate limiter admits every sample (nothing inserts into a teacher's table).
    Chunk and item files are hard links where the file system allows, else copies.
    Returns:
        `work_root`, to pass as a checkpointer root (its only checkpoint is the copy).
    Raises:
        ReplayCheckpointError: no complete checkpoint under `teacher_root`, or an unreadable one.
    """
    src = latest_checkpoint(teacher_root)
    if src is None:
        raise ReplayCheckpointError(
            f"no complete Reverb checkpoint under {teacher_root}; a DQN run writes one at its end "
            "(or run `rlfleet replay-checkpoint --replay HOST:PORT` while its replay server runs)."
        )
    tables = read_tables(src)
    shutil.rmtree(work_root, ignore_errors=True)
    dst = os.path.join(work_root, os.path.basename(src))
    os.makedirs(dst)
    for name in os.listdir(src):
        if name in (TABLES_FILE, DONE):
            continue
        try:
            os.link(os.path.join(src, name), os.path.join(dst, name))
        except OSError:
            shutil.copy2(os.path.join(src, name), os.path.join(dst, name))
    with tf.io.TFRecordWriter(os.path.join(dst, TABLES_FILE), "ZLIB") as w:
        for t in tables:
            t.rate_limiter.min_diff = -sys.float_info.max
            t.rate_limiter.max_diff = sys.float_info.max
            t.rate_limiter.min_size_to_sample = 1
            w.write(t.SerializeToString())
    open(os.path.join(dst, DONE), "w").close()
    return work_root
