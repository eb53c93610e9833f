"""How a service process (replay, learner, actor) reacts to SIGTERM/SIGINT: it starts its clean stop, once,
however many signals come (kept free of heavy imports, as `rlfleet.common.parent` is)."""

from __future__ import annotations

import signal
import threading
from typing import Callable

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def on_stop_signals(*callbacks: Callable[[], object], signals=STOP_SIGNALS) -> bool:
    """Makes the first of `signals` run `callbacks` (e.g. `threading.Event.set` of the service's stop event), in
    order, on a thread of their own; later signals change nothing, the stop being under way.

    A handler must not take a lock: Python runs it in the main thread between two bytecodes, possibly while that
    thread holds the lock itself (inside `Event.wait` or the handler's own `Event.set`), and a second signal then
    waits forever for a lock its own thread holds (seen: `rlfleet replay` hung for good, its final checkpoint
    never written, after a burst of SIGTERMs). The handler here only starts a (daemon) thread, which takes the
    stop's locks once the main thread lets them go; starting a thread takes only CPython's re-entrant thread-table
    lock and the new thread's own start event. The callbacks should be idempotent: two signals that come close
    together may both start the thread.

    Returns:
        False, installing nothing, when called off the main thread (where Python refuses signal handlers: a
        service run inside another program's thread stops through its stop event alone).
    """
    if threading.current_thread() is not threading.main_thread():
        return False
    fired = []  # a plain list: a handler must take no lock

    def run() -> None:
        for callback in callbacks:
            callback()

    def handler(signum, frame) -> None:
        if fired:
            return
        fired.append(signum)
        try:
            threading.Thread(target=run, daemon=True, name="stop-signal").start()
        except RuntimeError:  # no thread to be had: let a later signal try again
            fired.clear()
            raise

    for sig in signals:
        signal.signal(sig, handler)
    return True
