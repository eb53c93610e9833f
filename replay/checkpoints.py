"""Reverb replay checkpoints: where a run keeps them, which is newest, and reopening a teacher's replay read-only.

A DQN / QDagger replay server started with a checkpoint folder (`rlfleet up`
uses RUN_DIR/replay) restores the newest readable checkpoint there when it
starts, and writes a new one when asked (`checkpoint_replay`: the learner does
it at the end of a run, `rlfleet replay-checkpoint` on request; the server
itself every --checkpoint-interval and when it stops).

Reverb's own checkpointer names each checkpoint by the wall clock in the local
time zone, keeps only the name that sorts last (so once the clock or the time
zone goes back, it deletes the checkpoint it has just written), and finds its
folder by file-name patterns (a path holding `[`, `*`, `?` or `\\` matches
nothing, or another folder). So here Reverb writes into a staging folder of
its own (FOLDER/.reverb, reached through `rlfleet.common.files.glob_free`),
which is emptied before every checkpoint: each finished checkpoint is moved
out at once as FOLDER/ckpt-N, N one above the highest (`promote`), the newest
`KEEP` stay, and a server restores the newest of them that reads whole
(`usable_checkpoint`), handed to Reverb as the checkpoint to start from;
those that do not read are moved aside (`quarantine`). Folders of Reverb's own
names count as older than every ckpt-N.

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

import errno
import functools
import os
import re
import shutil
import sys
import zlib

import tensorflow as tf
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from rlfleet.common.files import fsync_path, glob_free, listdir, storage_error
from rlfleet.common.logs import logger

log = logger("replay")

DONE = "DONE"  # Reverb writes this file last into a complete checkpoint
TABLES_FILE = "tables.tfrecord"  # ZLIB-compressed TFRecord of PriorityTableCheckpoint messages
DATA_FILES = (TABLES_FILE, "chunks.tfrecord", "items.tfrecord")  # every file of a Reverb checkpoint but DONE
REPLAY_SUBDIR = "replay"  # a run directory's Reverb checkpoint root
STAGING = ".reverb"  # inside a checkpoint folder: where Reverb writes, before `promote` moves a checkpoint out
KEEP = 2  # checkpoints a folder keeps: the newest, and one to fall back to if the newest cannot be read
DAMAGED_PREFIX = "damaged-"  # checkpoints a server could not read, moved aside (`quarantine`)
REVERB_NAME_FILE = "reverb_name"  # in a ckpt-N folder: the name Reverb gave the checkpoint in the staging folder
_NUMBERED = re.compile(r"ckpt-(\d+)")


class ReplayCheckpointError(ValueError):
    """A replay checkpoint is missing or unreadable; the message says which and what to do."""


def _complete(path: str) -> bool:
    return os.path.isdir(path) and os.path.exists(os.path.join(path, DONE))


def checkpoints_newest_first(root: str) -> list[str]:
    """The complete Reverb checkpoints of the folder `root`, newest first: any not yet moved out of the staging
    folder, then ckpt-N by N, then folders of Reverb's own names (time stamps, as Reverb names them) by name.
    Checkpoints moved aside as damaged (`quarantine`) are not among them."""
    staging = os.path.join(root, STAGING)
    unpromoted = sorted((os.path.join(staging, n) for n in listdir(staging)), reverse=True)
    numbered, named = [], []
    for name in listdir(root):
        path = os.path.join(root, name)
        if name == STAGING or name.startswith(DAMAGED_PREFIX) or not _complete(path):
            continue
        m = _NUMBERED.fullmatch(name)
        (numbered if m else named).append((int(m.group(1)) if m else 0, name, path))
    return (
        [p for p in unpromoted if _complete(p)]
        + [p for _, _, p in sorted(numbered, reverse=True)]
        + [p for _, _, p in sorted(named, reverse=True)]
    )


def _reverb_name(checkpoint: str) -> str:
    """The name Reverb gave `checkpoint` when it wrote it (a folder of Reverb's own naming: its name)."""
    try:
        with open(os.path.join(checkpoint, REVERB_NAME_FILE)) as f:
            return f.read().strip()
    except OSError:
        return os.path.basename(checkpoint)


def latest_checkpoint(root: str) -> str | None:
    """The newest complete Reverb checkpoint under `root` (`checkpoints_newest_first`), or None."""
    found = checkpoints_newest_first(root)
    return found[0] if found else None


def promote(root: str, protect: str | None = None, then_prune: bool = True) -> list[str]:
    """Moves the finished checkpoints out of `root`'s staging folder into `root` as ckpt-N (N one above the
    highest there); when it moved any and `then_prune`, keeps the newest `KEEP` (`prune`; `protect`, the
    checkpoint a server restored, is never removed).

    Safe to call from several processes at once (a move that another one made first is skipped). Unfinished
    checkpoints in the staging folder are left for the server that writes them.
    Returns:
        the paths of the checkpoints moved, in the order they were written.
    Raises:
        rlfleet.common.files.StorageError: a checkpoint could not be moved (read-only or full disk).
    """
    staging = os.path.join(root, STAGING)
    moved = []
    for name in sorted(listdir(staging)):
        src = os.path.join(staging, name)
        if not _complete(src):
            continue
        try:  # the name Reverb gave it travels along (`checkpoint_replay` finds its checkpoint by it)
            with open(os.path.join(src, REVERB_NAME_FILE), "w") as f:
                f.write(name)
        except FileNotFoundError:  # another process moved it
            continue
        except OSError as e:
            raise storage_error(e, "a replay checkpoint", root) from None
        while True:
            numbers = [int(m.group(1)) for m in map(_NUMBERED.fullmatch, listdir(root)) if m]
            dst = os.path.join(root, f"ckpt-{max(numbers, default=0) + 1}")
            try:
                os.rename(src, dst)
                break
            except FileNotFoundError:  # another process moved it
                dst = None
                break
            except OSError as e:
                if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise storage_error(e, "a replay checkpoint", root) from None
                # another process took that number first: the next one
        if dst:
            moved.append(dst)
    if moved:
        fsync_path(root)
        fsync_path(staging)
        if then_prune:
            prune(root, protect=protect)
    return moved


def prune(root: str, keep: int = KEEP, protect: str | None = None) -> None:
    """Removes all but the newest `keep` complete checkpoints of `root` (not those still in its staging
    folder); `protect` is never removed."""
    staging = os.path.join(root, STAGING)
    kept = [p for p in checkpoints_newest_first(root) if os.path.dirname(p) != staging]
    for old in kept[keep:]:
        if protect is None or os.path.abspath(old) != os.path.abspath(protect):
            shutil.rmtree(old, ignore_errors=True)


def quarantine(paths: list[str]) -> list[str]:
    """Moves the checkpoint folders `paths` aside as damaged-NAME in their folder, so that they neither count
    among the kept checkpoints nor are restored; returns the new paths."""
    moved = []
    for path in paths:
        target = os.path.join(os.path.dirname(path), DAMAGED_PREFIX + os.path.basename(path))
        os.replace(path, target)
        moved.append(target)
    return moved


def discard_unfinished(root: str) -> list[str]:
    """Removes the unfinished checkpoints (no DONE) of `root`'s staging folder: a server that stopped while
    writing left them. Call only while no server writes there. Returns their names."""
    staging = os.path.join(root, STAGING)
    gone = [n for n in listdir(staging) if not _complete(os.path.join(staging, n))]
    for name in gone:
        shutil.rmtree(os.path.join(staging, name), ignore_errors=True)
    return gone


def _records(checkpoint: str, name: str, keep: bool) -> tuple[int, list[bytes]]:
    """Reads every record of the TFRecord file `name` of `checkpoint` (ZLIB, as Reverb writes them, else
    uncompressed, as it wrote before), checksums checked; returns their count and, with `keep`, the records
    (a chunks file can be as large as the replay: it is only counted). Raises ReplayCheckpointError naming the
    file."""
    shown = os.path.join(checkpoint, name)
    # Through an alias of the checkpoint's parent (one per run folder), by names without pattern characters.
    path = os.path.join(glob_free(os.path.dirname(checkpoint)), os.path.basename(checkpoint), name)
    if not os.path.exists(path):
        raise ReplayCheckpointError(f"{shown} is missing")
    errors = []
    for compression in ("ZLIB", ""):
        count, records = 0, []
        try:
            for record in tf.data.TFRecordDataset(path, compression_type=compression, buffer_size=1 << 20):
                count += 1
                if keep:
                    records.append(record.numpy())
            if compression and not _zlib_stream_complete(path):  # cut where a record ended: no error above
                raise ReplayCheckpointError(f"{shown} is cut short (its compressed stream does not end)")
            return count, records
        except (tf.errors.OpError, OSError) as e:
            errors.append(getattr(e, "message", str(e)).strip().splitlines()[0][:200])
    raise ReplayCheckpointError(f"{shown} cannot be read: {errors[0]}")


def _zlib_stream_complete(path: str) -> bool:
    """True when the file `path` holds a whole zlib stream (one that reaches its end marker); read in blocks."""
    stream = zlib.decompressobj()
    try:
        with open(path, "rb") as f:
            while block := f.read(1 << 20):
                while block and not stream.eof:
                    stream.decompress(block, 1 << 24)
                    block = stream.unconsumed_tail
                if stream.eof:
                    return True
    except zlib.error:
        return False
    return stream.eof


def validate(checkpoint: str) -> None:
    """Reads every record of the Reverb checkpoint `checkpoint` (tables, items, chunks; their checksums) and
    checks that nothing is missing: a record per table, as many items as the tables hold (their rate limiters'
    inserts minus deletes), chunks where there are items, and compressed streams that reach their end. An
    emptied file (a crash before the data reached the disk) reads as no records, not as an error.

    Raises:
        ReplayCheckpointError: a file is missing, truncated, emptied or damaged; the message names it.
    """
    _, tables = _records(checkpoint, TABLES_FILE, keep=True)
    chunks, _ = _records(checkpoint, DATA_FILES[1], keep=False)
    items, _ = _records(checkpoint, DATA_FILES[2], keep=False)
    if not tables:
        raise ReplayCheckpointError(f"{os.path.join(checkpoint, TABLES_FILE)} holds no table")
    cls = _table_message()
    held = sum(max(0, t.rate_limiter.insert_count - t.rate_limiter.delete_count) for t in map(cls.FromString, tables))
    if items != held:
        raise ReplayCheckpointError(f"{os.path.join(checkpoint, DATA_FILES[2])} holds {items} items, the tables {held}")
    if items and not chunks:
        raise ReplayCheckpointError(f"{os.path.join(checkpoint, DATA_FILES[1])} holds no chunk ({items} items)")


def usable_checkpoint(root: str) -> tuple[str | None, list[str], list[str]]:
    """The newest checkpoint of `root` that reads whole (`validate`); one line per newer one skipped (its path
    and the damage) and the paths of those. (None, [...], [...]) when none reads or there is none."""
    skipped, damaged = [], []
    for path in checkpoints_newest_first(root):
        try:
            validate(path)
            return path, skipped, damaged
        except ReplayCheckpointError as e:
            skipped.append(str(e))
            damaged.append(path)
    return None, skipped, damaged


def checkpointer(root: str, restore_from: str | None = None):
    """A Reverb checkpointer that writes into `root`'s staging folder (`promote` moves each checkpoint out) and
    starts the server from `restore_from` (a checkpoint folder; None: empty tables, unless the staging folder
    holds a finished checkpoint, which `promote` should have moved first)."""
    from reverb.platform import checkpointers_lib

    staging = os.path.join(root, STAGING)
    os.makedirs(staging, exist_ok=True)
    return checkpointers_lib.DefaultCheckpointer(
        glob_free(staging), fallback_checkpoint_path=glob_free(restore_from) if restore_from else None
    )


@functools.cache
def _checkpoint_response():
    """Reverb's `CheckpointResponse` message (reverb/cc/reverb_service.proto: field 1, checkpoint_path)."""
    f = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(
        name="rlfleet_reverb_checkpoint_response.proto", package="rlfleet.reverb_rpc", syntax="proto3"
    )
    msg = fdp.message_type.add(name="CheckpointResponse")
    msg.field.add(name="checkpoint_path", number=1, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("rlfleet.reverb_rpc.CheckpointResponse"))


def checkpoint_replay(address: str, timeout_s: float = 600.0, root: str | None = None) -> str | None:
    """Asks the Reverb server at `address` to write a checkpoint, waiting at most `timeout_s` seconds.

    Args:
        address: host:port of the replay server.
        timeout_s: seconds to wait for the checkpoint (the server may still finish it after that).
        root: the server's checkpoint folder as this process sees it (a run's RUN/replay), if it does: the new
            checkpoint is moved out of the staging folder (`promote`) and its path there returned.
    Returns:
        the checkpoint's folder (RUN/replay/ckpt-N) when `root` is given and this process sees the server's
        staging folder there; None otherwise (the server moves it to ckpt-N in its checkpoint folder itself
        within a second).
    Raises:
        ReplayCheckpointError: the server is unreachable, did not answer within `timeout_s`, or failed.
        rlfleet.common.files.StorageError: the checkpoint could not be moved out of the staging folder.
    """
    import grpc

    visible = bool(root) and os.path.isdir(os.path.join(root, STAGING))
    if visible:
        promote(root)  # Reverb keeps only the newest name in its staging folder: empty it first
    response = _checkpoint_response()
    try:
        with grpc.insecure_channel(address) as channel:
            call = channel.unary_unary(
                "/deepmind.reverb.ReverbService/Checkpoint",
                request_serializer=lambda _: b"",  # CheckpointRequest has no fields
                response_deserializer=response.FromString,
            )
            written = os.path.basename(call(None, timeout=timeout_s, wait_for_ready=False).checkpoint_path)
    except grpc.RpcError as e:
        late = e.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        why = f"no answer within {timeout_s:g} s" if late else f"failed: {e.details() or e.code().name}"
        raise ReplayCheckpointError(f"replay server {address} could not write a checkpoint ({why})") from None
    if not visible:
        return None
    promote(root)
    # The checkpoint just written, whichever process moved it: the newest whose Reverb name it kept inside.
    for path in checkpoints_newest_first(root):
        if _reverb_name(path) == written:
            return path
    return latest_checkpoint(root)


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


@functools.cache
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
        ("delete_count", 8, f.TYPE_INT64),
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
        records = tf.data.TFRecordDataset(os.path.join(glob_free(checkpoint), TABLES_FILE), compression_type="ZLIB")
        return [cls.FromString(r.numpy()) for r in records]
    except (tf.errors.OpError, OSError) as e:
        raise ReplayCheckpointError(f"{path} is not a readable Reverb checkpoint: {e}") from None


def open_teacher_replay(teacher_root: str, work_root: str) -> str:
    """Makes a read-only-use copy of the newest readable checkpoint under `teacher_root` in `work_root`.

    The copy's tables keep their items, sampler, remover and counters; their
    rate limiter admits every sample (nothing inserts into a teacher's table).
    Chunk and item files are hard links where the file system allows, else copies.
    A newer checkpoint that does not read whole is skipped with a warning.
    Returns:
        the copy's folder (in `work_root`), to pass as `checkpointer(work_root, restore_from=...)`.
    Raises:
        ReplayCheckpointError: no complete checkpoint under `teacher_root`, or none that reads.
    """
    src, skipped, _ = usable_checkpoint(teacher_root)
    for line in skipped:
        log.warning("skipped the damaged teacher replay checkpoint: %s", line)
    if src is None:
        raise ReplayCheckpointError(
            f"no readable Reverb checkpoint under {teacher_root}"
            + (f" ({'; '.join(skipped)})" if skipped else "")
            + "; a DQN run writes one at its end (or run `rlfleet replay-checkpoint --replay HOST:PORT` while "
            "its replay server runs)."
        )
    tables = read_tables(src)
    shutil.rmtree(work_root, ignore_errors=True)
    dst = os.path.join(work_root, "teacher")
    os.makedirs(dst)
    for name in os.listdir(src):
        if name in (TABLES_FILE, DONE):
            continue
        try:
            os.link(os.path.join(src, name), os.path.join(dst, name))
        except OSError:
            shutil.copy2(os.path.join(src, name), os.path.join(dst, name))
    with tf.io.TFRecordWriter(os.path.join(glob_free(dst), TABLES_FILE), "ZLIB") as w:
        for t in tables:
            t.rate_limiter.min_diff = -sys.float_info.max
            t.rate_limiter.max_diff = sys.float_info.max
            t.rate_limiter.min_size_to_sample = 1
            w.write(t.SerializeToString())
    open(os.path.join(dst, DONE), "w").close()
    return dst
