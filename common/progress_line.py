"""Progress lines for the waits people sit through (a teacher's evaluation, an offline phase, a replay restore):
`progress: WHAT 3,000/10,000 UNIT (250/s), about 28 s left`, at most one every few seconds, logged at NOTICE so
that `rlfleet up` shows them on its terminal too (`rlfleet.common.logs`)."""

from __future__ import annotations

import time

from rlfleet.common.logs import NOTICE, logger

log = logger("progress")
INTERVAL_S = 5.0  # the least seconds between two lines of one progress


def duration_words(seconds: float) -> str:
    """A duration for people: "45 s", "3 min", "1 h 5 min"."""
    seconds = max(0, int(round(seconds)))
    if seconds < 90:
        return f"{seconds} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 90 else f"{minutes // 60} h {minutes % 60} min"


class ProgressLine:
    """Logs the progress of one long step, on a monotonic clock.

    Args:
        what: the step ("teacher evaluation").
        unit: what `done` counts ("episodes", "learner steps", "MB").
        interval_s: the least seconds between two lines (default `INTERVAL_S`).
    """

    def __init__(self, what: str, unit: str, interval_s: float | None = None):
        self.what, self.unit = what, unit
        self.interval_s = INTERVAL_S if interval_s is None else interval_s
        self.started = time.monotonic()
        self.next_line = self.started + self.interval_s
        self.first_done: float | None = None

    def update(self, done: float, total: float | None, detail: str = "") -> bool:
        """Counts `done` of `total` (None: not known yet, so no time left is told) and logs a line when one is
        due; `detail` follows the count. Returns whether it logged. The rate is `done`'s since the first call."""
        now = time.monotonic()
        if self.first_done is None:
            self.first_done, self.started = done, now
        if now < self.next_line:
            return False
        self.next_line = now + self.interval_s
        log.log(NOTICE, "%s", self.line(done, total, detail, now))
        return True

    def line(self, done: float, total: float | None, detail: str = "", now: float | None = None) -> str:
        """The line `update` logs (`now`: the monotonic time to rate by)."""
        elapsed = (now if now is not None else time.monotonic()) - self.started
        rate = (done - (self.first_done or 0)) / elapsed if elapsed > 0 else 0.0
        count = f"{done:,.0f}/{total:,.0f}" if total else f"{done:,.0f}"
        text = f"progress: {self.what} {count} {self.unit} ({rate:,.0f}/s)"
        if detail:
            text += f", {detail}"
        if total and rate > 0 and done < total:
            text += f", about {duration_words((total - done) / rate)} left"
        return text


def _bytes_read() -> int | None:
    """The bytes this process has read so far (Linux: /proc/self/io rchar, page cache included); None elsewhere."""
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("rchar:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


class ReadingProgress:
    """Progress lines, from a thread of its own, while the calling thread reads `total_bytes` of files in one
    call that reports nothing itself (Reverb restoring a checkpoint): counted by the bytes the process reads.
    A context manager; nothing is logged where /proc/self/io is missing.

    Args:
        what: as `ProgressLine`'s.
        total_bytes: the size of what is read (the checkpoint's files).
    """

    def __init__(self, what: str, total_bytes: int):
        import threading

        self.line = ProgressLine(what, "MB")
        self.total_mb = total_bytes / 1e6
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True, name="reading-progress")

    def _watch(self) -> None:
        start = _bytes_read()
        if start is None:
            return
        while not self.stop.wait(0.5):
            now = _bytes_read()
            if now is not None:
                self.line.update(min((now - start) / 1e6, self.total_mb), self.total_mb)

    def __enter__(self) -> ReadingProgress:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()
