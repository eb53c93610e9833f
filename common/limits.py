"""The open-file limit: raised to what the system allows at start, and checked against what a batch of envs
needs before it is made.

Every process that holds connections or env processes (an actor with one process per env holds a pipe and a
process handle for each; a learner a connection per actor) needs open files; the soft limit many systems start
processes with (1024) is far below the hard one. `raise_open_file_limit` lifts the soft limit to the hard limit,
as a process may without privileges; `check_open_files` says, before envs are made, when even that is too few.
"""

from __future__ import annotations

import os
import resource

# Open files a process of rlfleet holds besides its envs' (its libraries, gRPC and Reverb connections, logs).
BASE_OPEN_FILES = 64


def raise_open_file_limit() -> tuple[int, int]:
    """Raises this process's soft limit of open files to its hard limit (children inherit it); returns (soft,
    hard) after. A system that refuses keeps the limit it had."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            return soft, hard
        soft = target
    return soft, hard


def _advice() -> str:
    """This process's open-file limit and the ways to live within it, as the rest of a sentence."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = "unlimited" if soft == resource.RLIM_INFINITY else str(soft)
    up_to = "" if hard == resource.RLIM_INFINITY else f", up to the hard limit of {hard}; a higher one needs root"
    return (
        f"this process's limit of open files is {limit}: raise it (`ulimit -n N` before starting{up_to}), step the "
        "envs on fewer processes (`rlfleet actor --env-backend workers`), or give the run fewer envs per actor "
        "(--envs-per-actor) and more actors"
    )


def open_files_problem(needed: int, what: str) -> str | None:
    """Why this process cannot hold `needed` more open files for `what` (a sentence naming the limit and the
    fix), or None when it can."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        held = len(os.listdir("/proc/self/fd"))
    except OSError:
        held = BASE_OPEN_FILES
    if soft == resource.RLIM_INFINITY or held + needed <= soft:
        return None
    return f"{what} need about {needed} open files besides the {held} this process holds, and {_advice()}."


def too_many_open_files(what: str) -> str:
    """The message of running out of open files (EMFILE) while making `what`, with the limit and the fix."""
    return f"ran out of open files while making {what}; {_advice()}."
