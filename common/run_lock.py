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
import time

from rlfleet.common.logs import NOTICE, logger
from rlfleet.common.parent import pid_alive

log = logger("run-lock")

LOCK_NAME = ".rlfleet-lock"
INHERITED_ENV = "RLFLEET_RUN_LOCK"  # "FD": the number of a lock file a parent passed down with the lock held
# errno values of a filesystem that has no flock: the directory is written without the lock.
_NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}

_held: dict[str, int] = {}  # lock file path -> the open file holding its lock, for the life of the process
# Seconds to wait for a lock whose holder is stopping: on this host, it or the process that started it has exited
# (the processes of a killed `up` checkpoint and exit on their parent's death).
STOPPING_WAIT_S = 180.0
_POLL_S = 0.5


class RunDirBusy(Exception):
    """Another process holds the run directory's lock; the message names it and what to do."""


def hold(directory: str, role: str, wait_s: float = 0.0) -> int | None:
    """Makes this process the one writer of `directory` (made if missing) for the rest of its life.

    A lock whose holder is stopping (on this host, it or the process that started it has exited: the processes of
    a killed `up` checkpoint and exit on their parent's death) is waited for up to `STOPPING_WAIT_S`; any other up
    to `wait_s` seconds (a supervisor's restart while the old process still runs: a Kubernetes pod replaced while
    the old one terminates), with one line that names the holder.

    Args:
        directory: the run directory (or another folder one process writes: a replay checkpoint folder).
        role: what this process is, for the message another writer gets ("up", "learner", "replay").
        wait_s: seconds to wait for a holder that is not stopping (0: refuse at once).
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
            _lock(fd, directory, wait_s)
        except OSError as e:
            os.close(fd)
            if e.errno not in _NO_LOCKS:
                raise
            log.warning("%s: this filesystem has no file locks (%s); nothing stops a second writer.", directory, e)
            return None
        except RunDirBusy:
            os.close(fd)
            raise
        _write_holder(fd, role)
    _held[path] = fd
    return fd


def _lock(fd: int, directory: str, wait_s: float) -> None:
    """Takes the lock on `fd`, waiting as `hold` says. Raises RunDirBusy, or OSError (no locks here)."""
    deadline, said = None, False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            holder = _holder(fd)
        now = time.monotonic()
        if deadline is None:
            deadline = now + (max(wait_s, STOPPING_WAIT_S) if _stopping(holder) else wait_s)
        if now >= deadline:
            raise RunDirBusy(_busy_message(directory, holder)) from None
        if not said:
            log.log(NOTICE, "waiting for %s to release %s (at most %.0f s)", _who(holder), directory, deadline - now)
            said = True
        time.sleep(_POLL_S)


def _alive(pid) -> bool:
    """`pid_alive` of a pid read from a lock file; one that is not a number is taken as running."""
    try:
        return pid_alive(int(pid))
    except (ValueError, TypeError, OverflowError):
        return True


def _stopping(holder: dict) -> bool:
    """Whether the lock's holder is on this host and stopping: it, or the process that started it, has exited."""
    if holder.get("host") != socket.gethostname() or not holder.get("pid"):
        return False
    return not _alive(holder["pid"]) or (bool(holder.get("parent")) and not _alive(holder["parent"]))


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
        parent=os.getppid(),
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


def _who(holder: dict) -> str:
    """The lock's holder as people read it."""
    if not holder.get("pid"):
        return "another process"
    who = f"`{holder.get('command') or 'rlfleet'}` ({holder.get('role', 'rlfleet')}, pid {holder['pid']} on "
    return who + f"host {holder.get('host', '?')}, since {holder.get('started', '?')})"


def _busy_message(directory: str, holder: dict) -> str:
    """Why the lock was not taken, and what to do."""
    if _stopping(holder):
        return (
            f"{directory} is still held by the processes that {_who(holder)} started, which have not stopped in "
            f"{STOPPING_WAIT_S:.0f} s since it ended; stop them (`ps -ef | grep rlfleet`), then try again."
        )
    stop = f"on {holder.get('host')}: kill {holder['pid']}" if holder.get("pid") else "stop it"
    then = "resume it with --resume" if holder.get("role") in ("up", "learner") else "start this again"
    message = (
        f"{directory} is being written by {_who(holder)}. Two writers would mix their rows in metrics.jsonl and "
        f"overwrite each other's run.json, summary.json and checkpoints. Let that process finish or stop it ({stop}), "
        f"then {then}; or give another directory."
    )
    if holder.get("host") and holder.get("host") != socket.gethostname():
        message += (
            f" Where its host is gone for good (a lock of a network filesystem that outlived it), removing "
            f"{os.path.join(directory, LOCK_NAME)} releases it."
        )
    return message


def busy(directory: str) -> str | None:
    """Why `directory` cannot be written now (another process holds its lock: `hold`'s message), or None where
    it is free or has no lock file; takes no lock."""
    path = os.path.join(directory, LOCK_NAME)
    if path in _held:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _busy_message(directory, _holder(fd))
    except OSError:  # no locks on this filesystem
        return None
    finally:
        os.close(fd)  # closing releases a lock taken just now
    return None
