"""One owner per run directory: an OS file lock that whatever writes a directory takes first.

`hold(directory, role)` takes an exclusive `flock` on DIRECTORY/.rlfleet-lock and keeps it for the life of the
process; the kernel releases it when the process ends however it ends, so a crash never leaves a stale lock. A
second writer (the same `rlfleet up` started twice, a requeued Slurm job while the first still runs, a replaced
Kubernetes pod while the old one terminates) is refused with `RunDirBusy`, which names the holder: its role, pid,
host, start time and command, written into the lock file by the holder.

A process that `rlfleet up` starts to write the same directory (its learner) is given up's lock: the open file
is passed down (`inheritable`) and its number named in $RLFLEET_RUN_LOCK, and `hold` takes that one when it is
the same file. Filesystems without `flock` (some network mounts) run without the lock, with one warning.
Read-only commands (`eval`, `export`, `report`, `status`) take no lock.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import os
import shlex
import socket
import sys

from rlfleet.common.logs import logger

log = logger("run-lock")

LOCK_NAME = ".rlfleet-lock"
INHERITED_ENV = "RLFLEET_RUN_LOCK"  # "FD": the number of a lock file a parent passed down with the lock held
# errno values of a filesystem that has no flock: the directory is written without the lock.
_NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}

_held: dict[str, int] = {}  # lock file path -> the open file holding its lock, for the life of the process


class RunDirBusy(Exception):
    """Another process holds the run directory's lock; the message names it and what to do."""


def hold(directory: str, role: str) -> int | None:
    """Makes this process the one writer of `directory` (made if missing) for the rest of its life.

    Args:
        directory: the run directory (or another folder one process writes: a replay checkpoint folder).
        role: what this process is, for the message another writer gets ("up", "learner", "replay").
    Returns:
        the open file that holds the lock (`inheritable` passes it to a child), or None where the filesystem
        has no locks.
    Raises:
        RunDirBusy: another process holds it.
        OSError: the folder or its lock file cannot be made.
    """
    path = os.path.join(directory, LOCK_NAME)
    if path in _held:
        return _held[path]
    os.makedirs(directory, exist_ok=True)
    fd = _inherited(path)
    if fd is None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise RunDirBusy(_busy_message(directory, holder)) from None
        except OSError as e:
            os.close(fd)
            if e.errno not in _NO_LOCKS:
                raise
            log.warning("%s: this filesystem has no file locks (%s); nothing stops a second writer.", directory, e)
            return None
        _write_holder(fd, role)
    _held[path] = fd
    return fd


def inheritable(fd: int | None) -> dict:
    """What a child process that writes the same directory needs to share this process's lock `fd` (from
    `hold`): {"pass_fds": ..., "env": {INHERITED_ENV: ...}} for `subprocess.Popen` (empty where no lock)."""
    if fd is None:
        return {"pass_fds": (), "env": {}}
    return {"pass_fds": (fd,), "env": {INHERITED_ENV: str(fd)}}


def _inherited(path: str) -> int | None:
    """The lock file a parent passed down (its number in $RLFLEET_RUN_LOCK) when it is `path`'s, else None."""
    try:
        fd = int(os.environ.get(INHERITED_ENV, ""))
        mine, theirs = os.fstat(fd), os.stat(path)
    except (ValueError, OSError):
        return None
    if (mine.st_dev, mine.st_ino) != (theirs.st_dev, theirs.st_ino):
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the parent's lock: the same open file, so it holds
    except OSError:
        return None
    os.set_inheritable(fd, False)
    return fd


def _write_holder(fd: int, role: str) -> None:
    """Writes who holds the lock into its file (in place: the lock is on this file, not on a name)."""
    holder = dict(
        role=role,
        pid=os.getpid(),
        host=socket.gethostname(),
        started=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        command=shlex.join(["rlfleet", *sys.argv[1:]]),
    )
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
    except OSError as e:  # the lock holds all the same; only the other writer's message says less
        log.warning("could not write who holds the run directory's lock (%s)", e)


def _holder(fd: int) -> dict:
    """Who holds the lock, as the holder wrote it ({} where unreadable)."""
    try:
        data = json.loads(os.pread(fd, 4096, 0).decode(errors="replace") or "{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _busy_message(directory: str, holder: dict) -> str:
    who = "another process"
    if holder.get("pid"):
        who = f"`{holder.get('command') or 'rlfleet'}` ({holder.get('role', 'rlfleet')}, pid {holder['pid']} on "
        who += f"host {holder.get('host', '?')}, since {holder.get('started', '?')})"
    stop = f"on {holder.get('host')}: kill {holder['pid']}" if holder.get("pid") else "stop it"
    return (
        f"{directory} is being written by {who}. Two writers would mix their rows in metrics.jsonl and overwrite "
        f"each other's run.json, summary.json and checkpoints. Let that run finish or stop it ({stop}), then "
        "resume it with --resume; or give another run directory."
    )
