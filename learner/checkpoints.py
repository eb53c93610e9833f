"""The learner's checkpoints: RUN/checkpoints/ckpt-N, written and read back whatever the run directory is named.

Each checkpoint is TensorFlow's pair of files `ckpt-N.index` and `ckpt-N.data-00000-of-00001` (written by
`tf.train.Checkpoint.write`) with its progress record `ckpt-N.progress.json` beside it
(`rlfleet.learner.run_dir.write_progress`), and TensorFlow's index file `checkpoint` names the kept ones, so that
`tf.train.latest_checkpoint` and TensorBoard still read the folder. `tf.train.CheckpointManager` is not used: its
helpers match file names as patterns, which finds nothing in a folder whose path holds `[`, `*`, `?` or `\\`.
Here every path reaches TensorFlow through `rlfleet.common.files.glob_free`, files are listed with `os.listdir`,
and:

- a checkpoint is complete (its files synced) before the index file names it; one whose write failed (a full
  disk) is removed with its record, and the newest good one stays;
- a restore tries the checkpoints newest first and takes the first that reads whole (files present, every
  tensor's checksum right, every object matched, record readable), saying which it skipped and why; a learner
  resuming its own run moves the skipped ones aside (`quarantine`: damaged-ckpt-N.*), so that they never count
  among the kept ones.
"""

from __future__ import annotations

import json
import os
import re
import shutil

import tensorflow as tf

from rlfleet.common.files import atomic_write, fsync_path, glob_free, listdir, storage_error, tree_bytes
from rlfleet.learner.run_dir import PROGRESS_SUFFIX, read_progress, write_progress

INDEX_FILE = "checkpoint"  # TensorFlow's CheckpointState, as text
_NUMBERED = re.compile(r"ckpt-(\d+)\.index")
_ANY_FILE = re.compile(r"ckpt-(\d+)[._]")
DAMAGED_PREFIX = "damaged-"  # checkpoints a restore skipped, moved aside: damaged-ckpt-N.index, ...
# What reading a damaged checkpoint raises (TensorFlow's reader: IndexError for a short read, OpErrors for bad
# checksums or missing files; ValueError/AssertionError for objects that do not match; ValueError/KeyError/TypeError
# for a progress record that does not parse). Other errors (out of memory, a failing disk) are not damage.
DAMAGE_ERRORS = (tf.errors.OpError, ValueError, AssertionError, IndexError, KeyError, TypeError)


class CheckpointError(ValueError):
    """No checkpoint of a folder could be read; the message lists each one tried and why it failed."""


def checkpoint_numbers(folder: str) -> list[int]:
    """The numbers N of the checkpoints ckpt-N in `folder` whose index file exists, newest (highest) first."""
    return sorted((int(m.group(1)) for m in map(_NUMBERED.fullmatch, listdir(folder)) if m), reverse=True)


def newest_checkpoint_name(folder: str) -> str | None:
    """The name (ckpt-N) of the newest checkpoint that the folder's files or its index file know of, or None."""
    named = [int(m.group(1)) for m in (re.fullmatch(r"ckpt-(\d+)", n) for n in _named_in_index(folder)) if m]
    numbers = checkpoint_numbers(folder) + named
    return f"ckpt-{max(numbers)}" if numbers else None


def _files_of(folder: str, number: int) -> list[str]:
    """Every file or folder in `folder` that belongs to checkpoint `number`: its TensorFlow files, the
    temporary folder of an unfinished write, and its progress record."""
    prefix = f"ckpt-{number}"
    return [
        os.path.join(folder, n)
        for n in listdir(folder)
        if n.startswith(prefix + ".") or n == prefix + "_temp" or n.startswith(prefix + "_temp.")
    ]


def _remove(paths: list[str]) -> None:
    for p in paths:
        if os.path.isdir(p):
            shutil.rmtree(p, ignore_errors=True)
        else:
            try:
                os.remove(p)
            except FileNotFoundError:
                pass


# (what an error's text says, the damage in words) for the errors a damaged checkpoint gives; the first match wins.
_DAMAGE_WORDS = (
    ("Read less bytes than requested", "a file is shorter than its index says (cut short)"),
    ("checksum does not match", "its data does not match its checksums (overwritten or corrupted)"),
    ("sstable", "its index file is damaged"),
    ("No such file", "a file of it is missing"),
    ("JSONDecodeError", "its progress record is damaged"),
)


def damage_in_words(error: BaseException) -> str:
    """Why a checkpoint could not be read, in words a person acts on, with the error it came from, e.g.
    "a file is shorter than its index says (cut short) [IndexError: Read less bytes than requested]"."""
    detail = (getattr(error, "message", None) or str(error)).strip()
    detail = f"{type(error).__name__}: {detail.splitlines()[0][:300] if detail else ''}"
    for needle, words in _DAMAGE_WORDS:
        if needle.lower() in detail.lower():
            return f"{words} [{detail}]"
    return f"it cannot be read [{detail}]"


def restore_newest(
    folder: str, checkpoint: tf.train.Checkpoint, partial: bool = False, number: int | None = None
) -> tuple[str, list[str]]:
    """Restores into `checkpoint` the newest checkpoint of `folder` that reads whole.

    Args:
        folder: a checkpoints folder (RUN/checkpoints).
        checkpoint: the objects to restore; every object saved in the checkpoint must match one of them.
        partial: the checkpoint may hold objects that `checkpoint` does not (a teacher's optimizer).
        number: restore ckpt-`number` only, not the newest.
    Returns:
        (the restored checkpoint's path prefix, e.g. RUN/checkpoints/ckpt-5; one line per newer checkpoint
        skipped, naming it and the error).
    Raises:
        CheckpointError: `folder` holds no checkpoint (or no ckpt-`number`: the message lists those it holds),
            or none that reads; the message lists why each failed.
    """
    skipped = []
    named = _named_in_index(folder)
    numbers = checkpoint_numbers(folder)
    if number is not None:
        if number not in numbers:
            held = ", ".join(map(str, sorted(numbers))) or "none"
            raise CheckpointError(f"no checkpoint ckpt-{number} in {folder} (it holds checkpoints {held})")
        numbers, named = [number], []
    for name in named:
        m = re.fullmatch(r"ckpt-(\d+)", name)
        if m and int(m.group(1)) not in numbers:
            skipped.append(f"{name}: named by {INDEX_FILE} but its files are gone")
    for number in numbers:
        path = os.path.join(folder, f"ckpt-{number}")
        alias = os.path.join(glob_free(folder), f"ckpt-{number}")
        try:
            read_progress(path)  # a record that does not parse is damage too
            # Every tensor read once (checksums): variables made later (optimizer slots) are restored lazily,
            # and damage in them would surface mid-run.
            reader = tf.train.load_checkpoint(alias)
            for name in reader.get_variable_to_shape_map():
                reader.get_tensor(name)
            status = checkpoint.read(alias)
            if partial:
                status.expect_partial()
            status.assert_existing_objects_matched()
            return path, skipped
        except DAMAGE_ERRORS as e:
            skipped.append(f"ckpt-{number}: {damage_in_words(e).replace(alias, path)}")
    if not numbers:
        raise CheckpointError(f"no checkpoint in {folder}" + (f" ({'; '.join(skipped)})" if skipped else ""))
    raise CheckpointError(f"no checkpoint in {folder} can be read: {'; '.join(skipped)}")


def quarantine(folder: str, skipped: list[str]) -> list[str]:
    """Moves the files of the checkpoints that `restore_newest` skipped (its `skipped` lines) aside as
    damaged-ckpt-N.*, so that they no longer count as checkpoints; returns the names moved."""
    moved = []
    for line in skipped:
        m = re.match(r"ckpt-(\d+):", line)
        if not m:
            continue
        for path in _files_of(folder, int(m.group(1))):
            target = os.path.join(folder, DAMAGED_PREFIX + os.path.basename(path))
            os.replace(path, target)
            moved.append(os.path.basename(target))
    if moved:
        fsync_path(folder)
    return moved


def _named_in_index(folder: str) -> list[str]:
    """The checkpoint names TensorFlow's index file lists (relative names), newest last; [] if it is missing
    or unreadable."""
    try:
        with open(os.path.join(folder, INDEX_FILE)) as f:
            text = f.read()
    except (OSError, UnicodeDecodeError):
        return []
    names = re.findall(r'^(?:all_)?model_checkpoint_paths?:\s*"(.*)"\s*$', text, re.M)
    return list(dict.fromkeys(os.path.basename(n) for n in names))


class CheckpointStore:
    """Writes the checkpoints of one folder and removes all but the newest `keep`.

    Args:
        folder: RUN/checkpoints (created at the first save).
        checkpoint: the objects to save.
        keep: how many checkpoints stay (older ones are removed with their records).
    """

    def __init__(self, folder: str, checkpoint: tf.train.Checkpoint, keep: int = 3):
        self.folder, self.checkpoint, self.keep = folder, checkpoint, keep
        numbers = checkpoint_numbers(folder)
        self.latest: str | None = os.path.join(folder, f"ckpt-{numbers[0]}") if numbers else None

    def save(self, progress: dict) -> str:
        """Writes the next checkpoint (number: one above the highest in the folder) and its progress record.

        Returns:
            its path prefix (RUN/checkpoints/ckpt-N).
        Raises:
            rlfleet.common.files.StorageError: it could not be written (full disk, read-only folder); nothing of
            it is left, and the checkpoints before it are untouched.
        """
        numbers = checkpoint_numbers(self.folder)
        # Above every number any file has, a damaged checkpoint's leftovers included: nothing is overwritten.
        number = max((int(m.group(1)) for m in map(_ANY_FILE.match, listdir(self.folder)) if m), default=0) + 1
        path = os.path.join(self.folder, f"ckpt-{number}")
        try:
            # The record goes first: a checkpoint the index names always has one.
            write_progress(path, progress)
            self.checkpoint.write(os.path.join(glob_free(self.folder), f"ckpt-{number}"))
            for name in os.listdir(self.folder):
                if name.startswith(f"ckpt-{number}.") and not name.endswith(PROGRESS_SUFFIX):
                    fsync_path(os.path.join(self.folder, name))
            fsync_path(self.folder)
        except (OSError, tf.errors.OpError) as e:
            _remove(_files_of(self.folder, number))
            if isinstance(e, tf.errors.OpError):
                e = OSError(getattr(e, "errno", None) or _errno_of(e), e.message)
            before = _files_of(self.folder, numbers[0]) if numbers else []  # the last one's size: the estimate
            raise storage_error(e, "a learner checkpoint", self.folder, tree_bytes(before) or None) from None
        kept = sorted([number, *numbers], reverse=True)[: self.keep]
        try:
            self._write_index(sorted(kept))
        except OSError as e:
            raise storage_error(e, "the checkpoint index", self.folder) from None
        # Everything else numbered goes: older checkpoints, their records, leftovers of writes that failed.
        for old in {int(m.group(1)) for m in map(_ANY_FILE.match, listdir(self.folder)) if m} - set(kept):
            _remove(_files_of(self.folder, old))
        self.latest = path
        return path

    def _write_index(self, numbers: list[int]) -> None:
        """TensorFlow's index file naming checkpoints `numbers` (oldest first), written atomically."""
        names = [f"ckpt-{n}" for n in numbers]
        lines = [f"model_checkpoint_path: {json.dumps(names[-1])}"]
        lines += [f"all_model_checkpoint_paths: {json.dumps(n)}" for n in names]
        atomic_write(os.path.join(self.folder, INDEX_FILE), "\n".join(lines) + "\n")


def _errno_of(e: tf.errors.OpError) -> int:
    """An errno for a TensorFlow write error (its message is the file system's): ENOSPC for a full disk."""
    import errno

    text = e.message.lower()
    if "no space" in text:
        return errno.ENOSPC
    if "read-only" in text:
        return errno.EROFS
    if "permission" in text:
        return errno.EACCES
    return errno.EIO
