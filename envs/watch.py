"""A time limit on env calls: an env whose `reset`, `step` or `close` does not return within it (a user's env caught in
a loop, or waiting on a simulator that died) is reported and interrupted instead of stopping its process for good.

`EnvWatch` watches one thread's env calls, made through `watched(env, watch)`. A call still running after
`timeout_s` seconds is logged as an error (the env id, the call, what the caller says of the envs such as their
seeds, and the stack of the thread it hangs in), then interrupted: an `EnvHang` is raised in that thread (in the
main thread by a signal, which also ends a blocking system call; in another thread at its next Python instruction),
and the caller handles it as it handles any exception the env raised (the learner skips that evaluation, an actor
stops naming the env). A call that the interrupt does not end within `GRACE_S` seconds (code outside Python that
holds on) ends the process: all threads' stacks go to standard error first, and `on_stuck` runs (the learner
checkpoints there). Should even the watch's own thread get no turn (a call outside Python that never lets go of the
interpreter), the process ends after `timeout_s` + 2 `GRACE_S` seconds with every stack written out
(`faulthandler.dump_traceback_later`, exit status 1).
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import signal
import sys
import threading
import time
import traceback
from typing import Callable

from rlfleet.common.logs import logger
from rlfleet.envs import ENV_TIMEOUT_S

log = logger("envs")

__all__ = ["ENV_TIMEOUT_S", "EnvHang", "EnvWatch", "watched"]
GRACE_S = 30.0  # seconds an interrupted call has to end before its process is ended
EXIT_STUCK = 2  # exit status of a process ended because an env call did not stop when interrupted
_SIGNAL = signal.SIGUSR2  # interrupts the main thread's env call


class EnvHang(Exception):
    """An env call did not return within the watch's time limit (`EnvWatch`); the message names the env, the
    call and the limit."""


class EnvWatch:
    """Watches the env calls one thread makes through `watched(env, self)`: a context manager, active between
    entering and leaving it, on the thread that enters it.

    Args:
        env_id: the env, for messages.
        timeout_s: seconds an env call may take (0 or less: no watch at all).
        describe: returns what the messages add about the envs (e.g. "env seeds from 7"; "" for nothing).
        on_stuck: called (on the watch's thread) before the process ends because an interrupted call did not
            end within `GRACE_S` seconds; None: nothing.
        poll_s: seconds between the watch's looks (default: a tenth of `timeout_s`, at most 1 s).
        grace_s: seconds an interrupted call has to end before the process ends.
    """

    def __init__(
        self,
        env_id: str,
        timeout_s: float,
        describe: Callable[[], str] = lambda: "",
        on_stuck: Callable[[], None] | None = None,
        poll_s: float | None = None,
        grace_s: float = GRACE_S,
    ):
        self.env_id, self.timeout_s, self.describe, self.on_stuck = env_id, float(timeout_s), describe, on_stuck
        self.poll_s = poll_s if poll_s is not None else min(1.0, self.timeout_s / 10)
        self.grace_s = grace_s
        self.active = False
        self.message = ""
        self._call: tuple[str, float] | None = None  # (what, monotonic start) of the call in progress
        self._interrupted: tuple[str, float] | None = None  # the call interrupted, and when
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._ident = 0
        self._previous_handler = None

    def __enter__(self) -> EnvWatch:
        if self.timeout_s <= 0:
            return self
        self._ident, self.active = threading.get_ident(), True
        if self._ident == threading.main_thread().ident:
            self._previous_handler = signal.signal(_SIGNAL, self._on_signal)
        self._done.clear()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="env-watch")
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if not self.active:
            return
        self.active = False
        self._done.set()
        self._thread.join()
        faulthandler.cancel_dump_traceback_later()
        if self._previous_handler is not None:
            signal.signal(_SIGNAL, self._previous_handler)
            self._previous_handler = None

    def begin(self, what: str) -> None:
        """Marks the start of the env call `what` ("step", "reset", "close") on the watched thread."""
        self._call = (what, time.monotonic())

    def end(self) -> None:
        """Marks the end of the call `begin` started."""
        self._call = None

    def hang(self) -> EnvHang:
        """The `EnvHang` of the call interrupted last, with its message."""
        return EnvHang(self.message)

    def _on_signal(self, signum, frame) -> None:
        call = self._call
        if call is not None and self._interrupted == call:
            raise self.hang()

    def _loop(self) -> None:
        deadman = self.timeout_s + 2 * self.grace_s
        while not self._done.wait(self.poll_s):
            # Re-armed at each look: fires only when this thread has had no turn for `deadman` seconds.
            faulthandler.dump_traceback_later(deadman, exit=True, file=sys.stderr)
            call, now = self._call, time.monotonic()
            if call is None or now - call[1] < self.timeout_s:
                continue
            if self._interrupted != call:
                self._interrupt(call)
            elif now - call[1] >= self.timeout_s + self.grace_s:
                self._end_process(call)

    def _interrupt(self, call: tuple[str, float]) -> None:
        what = call[0]
        about = self.describe()
        self.message = (
            f"{self.env_id}: its {what}() did not return within {self.timeout_s:g} s ({about + '; ' if about else ''}"
            "--env-timeout sets the limit); the env hangs, or needs a longer limit"
        )
        frame = sys._current_frames().get(self._ident)
        stack = "".join(traceback.format_stack(frame)) if frame is not None else "(the thread has ended)\n"
        log.error("%s. Where it hangs:\n%s", self.message, stack.rstrip("\n"))
        self._interrupted = call
        if self._previous_handler is not None:  # the main thread: a signal ends a blocking system call too
            signal.pthread_kill(self._ident, _SIGNAL)
        else:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self._ident), ctypes.py_object(EnvHang))

    def _end_process(self, call: tuple[str, float]) -> None:
        log.critical(
            "%s; it did not stop when interrupted within %g s more, so this process ends (exit %d). Every thread's "
            "stack follows.",
            self.message,
            self.grace_s,
            EXIT_STUCK,
        )
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        try:
            if self.on_stuck is not None:
                self.on_stuck()
        finally:
            sys.stderr.flush()
            os._exit(EXIT_STUCK)


class _Watched:
    """An env (single or batched) whose `reset`, `step` and `close` run under an `EnvWatch`; every other attribute
    is the env's own."""

    def __init__(self, env, watch: EnvWatch):
        self.env, self._watch, self._hung = env, watch, False

    def __getattr__(self, name):
        return getattr(self.env, name)

    def _call(self, what: str, method, *args, **kwargs):
        watch = self._watch
        watch.begin(what)
        try:
            return method(*args, **kwargs)
        except EnvHang:
            self._hung = True
            raise watch.hang() from None
        finally:
            watch.end()

    def reset(self, **kwargs):
        return self._call("reset", self.env.reset, **kwargs)

    def step(self, action):
        return self._call("step", self.env.step, action)

    def close(self, **kwargs):
        """Closes the env; after a call that hung, a batched env's worker processes are ended rather than waited
        for, and a close that hangs as well is given up (logged)."""
        if not self._hung:
            return self._call("close", self.env.close, **kwargs)
        try:
            try:
                self._call("close", self.env.close, terminate=True)
            except TypeError:  # an env whose close takes no `terminate`
                self._call("close", self.env.close)
        except EnvHang:
            log.error("%s: its close() hung as well; given up.", self._watch.env_id)


def watched(env, watch: EnvWatch):
    """`env` with its `reset`, `step` and `close` under `watch` (`env` itself when the watch is off)."""
    return _Watched(env, watch) if watch.timeout_s > 0 else env
