"""Files rlfleet writes and the paths it hands to libraries.

- `atomic_write`: a file is written whole or not at all (temporary file in the same folder, fsync, rename, fsync
  of the folder), so a crash or a full disk never leaves half of it under its name.
- `glob_free`: TensorFlow's checkpoint reader and Reverb's checkpointer expand `*`, `?`, `[...]` and `\\` in the
  paths they are given (TensorFlow's `GetMatchingPaths`). A folder whose path holds any of them is handed to them
  as `/proc/self/fd/N`, a name of the same folder held open by this process that holds none.
- `read_json_lines` / `open_json_lines`: an append-only file of JSON lines (metrics.jsonl) is read past a line a
  crash cut short, and appended to from a new line.
- `StorageError`: an `OSError` of writing (full disk, read-only or missing folder, no permission) as the message
  `rlfleet: error:` prints: what could not be written, why, and what to do.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import threading

from rlfleet.common.logs import logger

log = logger("files")

# Characters TensorFlow's file-name matching treats as patterns (tensorflow/tsl/platform/file_system_helper.cc).
GLOB_CHARACTERS = frozenset("*?[]\\{}")

_aliases: dict[str, int] = {}  # folder (absolute) -> a descriptor of it held open by this process
_aliases_lock = threading.Lock()


class StorageError(OSError):
    """A folder or file could not be written; the message names it, the reason and the fix."""

    def __str__(self) -> str:
        return self.strerror or super().__str__()


def _megabytes(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def disk_space(path: str, needed_bytes: int | None = None) -> str:
    """How much space is free on the disk of `path` (of the nearest existing folder above it), and, when
    `needed_bytes` is given, how much a write there needs, in words ("0.2 MB free there; it needs about 0.4
    MB"); "" when the disk cannot be asked."""
    folder = os.path.abspath(path)
    while not os.path.isdir(folder) and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)
    try:
        free = os.statvfs(folder)
    except OSError:
        return ""
    said = f"{_megabytes(free.f_bavail * free.f_frsize)} free there"
    return said + (f"; it needs about {_megabytes(needed_bytes)}" if needed_bytes else "")


def tree_bytes(paths: list[str]) -> int:
    """The bytes of the files `paths` and of every file in the folders among them (0 for those that are gone)."""
    total = 0
    for path in paths:
        if os.path.isdir(path):
            for folder, _, files in os.walk(path):
                total += tree_bytes([os.path.join(folder, f) for f in files])
        else:
            try:
                total += os.path.getsize(path)
            except OSError:
                pass
    return total


def storage_error(e: OSError, what: str, path: str, needed_bytes: int | None = None) -> StorageError:
    """`e` (raised writing `what` to `path`) as a `StorageError` whose message says why and what to do; for a
    full disk also the space free there and, given `needed_bytes` (an estimate), what the write needs."""
    space = disk_space(path, needed_bytes) if e.errno in (errno.ENOSPC, errno.EDQUOT) else ""
    hint = {
        errno.ENOSPC: "the disk is full: free space there (or give a folder on another disk)",
        errno.EDQUOT: "the disk quota is used up: free space there (or give a folder on another disk)",
        errno.EROFS: "give a folder on a writable disk",
        errno.EACCES: "this user may not write there: give a folder you can write to (or fix its permissions)",
        errno.EPERM: "this user may not write there: give a folder you can write to (or fix its permissions)",
        errno.ENOENT: "a folder on the way does not exist: create it or give another path",
        errno.ENOTDIR: "a part of the path is a file, not a folder: give another path",
    }.get(e.errno, "check the folder and the disk")
    reason = f"{e.strerror or e} ({space})" if space else f"{e.strerror or e}"
    return StorageError(e.errno, f"cannot write {what} to {path}: {reason}; {hint}.")


def check_writable(folder: str, what: str) -> None:
    """Creates `folder` if needed and checks that a file can be written in it (one is written, synced and
    removed).

    Raises:
        StorageError: naming `what` the folder is for, the reason (read-only, no permission, full disk) and the fix.
    """
    probe = os.path.join(folder, f".rlfleet-write-check-{os.getpid()}")
    try:
        os.makedirs(folder, exist_ok=True)
        with open(probe, "wb") as f:
            f.write(b"rlfleet")
            f.flush()
            os.fsync(f.fileno())
        os.remove(probe)
    except OSError as e:
        raise storage_error(e, what, folder) from None


def listdir(folder: str) -> list[str]:
    """The names in `folder`; [] when it does not exist (or is not a folder)."""
    try:
        return os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return []


# errno values of an fsync that the filesystem does not do for folders (network and FUSE filesystems).
_NO_FOLDER_FSYNC = {errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EBADF, errno.EACCES}
_told_no_folder_fsync: set[int] = set()  # the filesystems (st_dev) already said to have none, once per process


def fsync_path(path: str) -> None:
    """Makes a file's contents, or a folder's names (files created, renamed or removed there), durable.

    A folder on a filesystem that does not fsync folders (network and FUSE mounts) is left as it is, with one
    warning per filesystem: the files' own fsync and the renames have happened, and the names are as durable as
    that filesystem makes them.

    Raises:
        OSError: the fsync of a file failed, or a folder's for another reason.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:
        st = os.fstat(fd)
        if not stat.S_ISDIR(st.st_mode) or e.errno not in _NO_FOLDER_FSYNC:
            raise
        if st.st_dev not in _told_no_folder_fsync:
            _told_no_folder_fsync.add(st.st_dev)
            log.warning(
                "the filesystem of %s does not fsync folders (%s); files are still written whole and renamed into "
                "place, but a power cut may lose the latest names there.",
                path,
                os.strerror(e.errno),
            )
    finally:
        os.close(fd)


def atomic_write(path: str, data: bytes | str) -> None:
    """Writes `data` to `path`: a reader sees the old file or the new one, never part of one.

    Raises:
        OSError: the write failed (nothing replaced `path`; the temporary file is removed).
    """
    tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise
    fsync_path(os.path.dirname(os.path.abspath(path)))


def glob_free(folder: str) -> str:
    """A path of the existing folder `folder` that no file-name pattern matching misreads.

    Returns `folder` made absolute when it holds none of `GLOB_CHARACTERS`; else `/proc/self/fd/N`, N a
    descriptor of the folder this process keeps open (one per folder, reopened if the folder was replaced):
    alias long-lived folders (a run's checkpoint folders), and reach their contents by names that hold none of
    the characters. The alias means the folder only inside this process: never hand it to another one or print
    it.

    Raises:
        OSError: the folder does not exist, or the system has no /proc/self/fd.
    """
    real = os.path.abspath(folder)
    if not GLOB_CHARACTERS & set(real):
        return real
    with _aliases_lock:
        fd = _aliases.get(real)
        if fd is not None:
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(real))
            except OSError:
                same = False
            if not same:
                os.close(fd)
                fd = None
        if fd is None:
            fd = os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            _aliases[real] = fd
    alias = f"/proc/self/fd/{fd}"
    if not os.path.isdir(alias):
        raise OSError(
            errno.ENOTSUP,
            f"{folder}: its path holds characters TensorFlow and Reverb read as file-name patterns "
            f"({''.join(sorted(GLOB_CHARACTERS & set(real)))}), and this system has no /proc/self/fd to name it "
            "otherwise; use a folder without them.",
        )
    return alias


def read_json_lines(path: str) -> tuple[list, int]:
    """The JSON values of the file `path`, one per line, and the number of lines skipped: a line that is not one
    JSON value (cut short by a crash, or two half lines run together) is skipped wherever it is, and the lines
    after it are kept. Blank lines are ignored.

    Raises:
        OSError: the file cannot be read (FileNotFoundError where there is none).
    """
    rows, skipped = [], 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except ValueError:
                skipped += 1
    return rows, skipped


def open_json_lines(path: str):
    """`path` opened to append JSON lines (text): when the file's last line was cut short (a crash while it was
    written), the next one starts on a new line, so that the torn line stays alone and every row after it reads
    (`read_json_lines`).

    Raises:
        OSError: the file cannot be opened.
    """
    f = open(path, "a+b")
    try:
        if f.seek(0, os.SEEK_END) > 0:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                f.write(b"\n")
                f.flush()
    finally:
        f.close()
    return open(path, "a", encoding="utf-8")
