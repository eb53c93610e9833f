"""Ties a process that `rlfleet up` started to `up`'s life (kept free of heavy imports: every `rlfleet`
command calls it first, `status` and `health` too)."""

from __future__ import annotations

import os
import signal
import sys
import time

PARENT_PID_ENV = "RLFLEET_PARENT_PID"  # set for the processes `up` starts: they stop when `up` dies


def die_with_parent() -> None:
    """Called first by every `rlfleet` command. In a process that `up` started ($RLFLEET_PARENT_PID set), makes
    the process get SIGTERM (and so checkpoint and stop) when `up` dies, however it dies (SIGKILL, OOM kill):
    on Linux through the kernel's parent-death signal (prctl PR_SET_PDEATHSIG), elsewhere through a thread that
    watches the parent pid every second. Exits at once when `up` is already gone."""
    parent = os.environ.pop(PARENT_PID_ENV, "")  # popped: the process's own children do not inherit it
    if not parent:
        return
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    else:
        import threading

        def watch():
            while os.getppid() == int(parent):
                time.sleep(1.0)
            os.kill(os.getpid(), signal.SIGTERM)

        threading.Thread(target=watch, daemon=True, name="parent-watch").start()
    if os.getppid() != int(parent):  # died before the signal was armed
        sys.exit("rlfleet: the `rlfleet up` that started this process is gone; not starting.")


def pid_alive(pid: int) -> bool:
    """Whether a process with id `pid` runs on this machine (one of another user's counts as running)."""
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
