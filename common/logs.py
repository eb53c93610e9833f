"""One log channel per process: every line a service writes names the time, the process's role and pid, and a
level an operator can raise or lower (`--log-level`, or `RLFLEET_LOG_LEVEL`).

A line reads `2026-12-07T15:30:01.123Z learner[4242] NOTICE resumed from RUN/checkpoints/ckpt-40`: the time in
UTC to the millisecond, the role (`learner`, `replay`, `actor-3`, `up`), the pid, the level, the message. A line
another library logged through Python's logging names it before the message (`... WARNING [tensorflow] ...`).
`NOTICE` sits between INFO and WARNING: rlfleet's lines a person running `rlfleet up` is shown on the terminal
as well (`RELAYED_LEVELS`), such as where a run resumed from and the progress of long waits.
"""

from __future__ import annotations

import logging
import sys
import time

NOTICE = 25
logging.addLevelName(NOTICE, "NOTICE")
LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "notice": NOTICE,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
DEFAULT_LEVEL = "info"
LEVEL_ENV = "RLFLEET_LOG_LEVEL"  # the level when --log-level is not given
# The levels of the lines `rlfleet up` prints from its children's logs.
RELAYED_LEVELS = ("NOTICE", "WARNING", "ERROR", "CRITICAL")

_role = "rlfleet"


class _Format(logging.Formatter):
    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802 (logging's name)
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.name != "rlfleet" and not record.name.startswith("rlfleet."):
            message = f"[{record.name}] {message}"  # another library's: `up` does not relay it
        text = f"{self.formatTime(record)} {_role}[{record.process}] {record.levelname} {message}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def configure(role: str, level: str = DEFAULT_LEVEL, stream=None) -> None:
    """Sends this process's log lines, rlfleet's at `level` and other libraries' at WARNING and above, to `stream`
    (default: standard error) in the format above. Called once when a process starts; again to change them.

    Args:
        role: what the process is ("learner", "replay", "actor", "up").
        level: one of `LEVELS`' names.

    Raises:
        ValueError: `level` is not one of `LEVELS`' names.
    """
    if level not in LEVELS:
        raise ValueError(f"log level {level!r}: use one of {', '.join(LEVELS)}")
    set_role(role)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(_Format())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("rlfleet").setLevel(LEVELS[level])


def set_role(role: str) -> None:
    """Names the process in the lines that follow (an actor becomes `actor-3` once the learner numbers it)."""
    global _role
    _role = role


def logger(part: str) -> logging.Logger:
    """The logger of one part of rlfleet (`logger("learner")`); its lines carry the process's role, not `part`."""
    return logging.getLogger(f"rlfleet.{part}")


def line_level(line: str) -> str | None:
    """The level of one of rlfleet's lines in this format ("WARNING"); None for another library's line, logged
    (`[name] ...`) or written in its own format."""
    parts = line.split(" ", 3)
    if len(parts) < 4 or not parts[1].endswith("]") or "[" not in parts[1] or not parts[0].endswith("Z"):
        return None
    if parts[3].startswith("["):
        return None
    return parts[2] if parts[2] in logging.getLevelNamesMapping() else None
