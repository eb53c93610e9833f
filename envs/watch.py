"""A time limit on env calls: an env whose construction, `reset`, `step`, `render` or `close` does not return within
it (a user's env caught in a loop, or waiting on a simulator that died) is reported and interrupted instead of
stopping its process for good.

`EnvWatch` watches one thread's env calls, made through `watched(env, watch)` (or marked with `begin` and `end`).
A call still running after `timeout_s` seconds is logged as an error (the env id, the call, what the caller says
of the envs such as their seeds, and the stack of the thread it hangs in), then interrupted: an `EnvHang` is
raised in that thread, and the caller handles it as it handles any `EnvError` (the learner skips that evaluation,
an actor stops naming the env). On the main thread a signal raises it, which also ends a blocking system call
(a socket read, a sleep); on another thread it is raised at the thread's next Python instruction, so a call
blocked in a system call there is only reported. A main-thread call that the interrupt does not end within
`GRACE_S` seconds (code outside Python that holds on, or an env that catches every exception) ends the process:
all threads' stacks go to standard error first, and `on_stuck` runs (the learner checkpoints there); another
thread's is given up (left running, reported). Should even the watch's own thread get no turn while the main
thread is watched (a call outside Python that never lets go of the interpreter), the process ends after
`timeout_s` + 2 `GRACE_S` seconds with every stack written out (`faulthandler.dump_traceback_later`, exit 1).

An env that catches every exception (`except Exception`) around its own waiting catches `EnvHang` too; it then
ends its process after the grace, as above.
"""

from __future__ import annotations

import ctypes
import faulthandler
import inspect
import os
import signal
import sys
import threading
import time
import traceback
from typing import Callable

from rlfleet.common.logs import logger
from rlfleet.envs import ENV_TIMEOUT_S
from rlfleet.envs.core import EnvError

log = logger("envs")

__all__ = ["ENV_TIMEOUT_S", "EnvHang", "EnvWatch", "watched"]

GRACE_S = 30.0  # seconds an interrupted call has to end before its process is ended
EXIT_STUCK = 2  # exit status of a process ended because an env call did not stop when interrupted
MIN_POLL_S = 0.05  # the shortest time between the watch's looks
_SIGNAL = signal.SIGUSR2  # interrupts the main thread's env call


class EnvHang(EnvError):
    """An env call did not return within the watch's time limit (`EnvWatch`); the message names the env, the
    call, the envs and the limit."""


class EnvWatch:
    """Watches the env calls one thread makes through `watched(env, self)` (or between `begin` and `end`): a
    context manager, active between entering and leaving it, on the thread that enters it.

    Args:
        env_id: the env, for messages.
        timeout_s: seconds an env call may take (0 or less: no watch at all).
        describe: returns what the messages add about the envs (e.g. "env seeds from 7"; "" for nothing).
        on_stuck: called (on the watch's thread) before the process ends because an interrupted main-thread call
            did not end within `grace_s` seconds; None: nothing.
        poll_s: seconds between the watch's looks (default: a tenth of `timeout_s`, within [`MIN_POLL_S`, 1]).
        grace_s: seconds an interrupted call has to end before the process ends (the main thread's) or the call
            is given up (another thread's).
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
        self.poll_s = max(MIN_POLL_S, poll_s if poll_s is not None else min(1.0, self.timeout_s / 10))
        self.grace_s = grace_s
        self.active = False
        self.message = ""
        self._call: tuple[str, float] | None = None  # (what, monotonic start) of the call in progress
        self._interrupted: tuple[str, float] | None = None  # the call interrupted last
        self._injected = False  # an EnvHang is pending in another thread (`PyThreadState_SetAsyncExc`)
        self._lock = threading.Lock()  # orders an interrupt against the end of the call it is for
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._ident = 0
        self._main = False
        self._previous_handler = None

    def __enter__(self) -> EnvWatch:
        if self.timeout_s <= 0:
            return self
        self._ident, self.active = threading.get_ident(), True
        self._main = self._ident == threading.main_thread().ident
        if self._main:
            self._previous_handler = signal.signal(_SIGNAL, self._on_signal)
        self._done.clear()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="env-watch")
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if not self.active:
            return
        self.active = False
        self.end()
        self._done.set()
        try:
            self._thread.join()
        finally:
            if self._main:
                faulthandler.cancel_dump_traceback_later()
                signal.signal(_SIGNAL, self._previous_handler)
                self._previous_handler = None

    def begin(self, what: str) -> None:
        """Marks the start of the env call `what` (e.g. "step()", "reset()", "construction") on the watched
        thread."""
        self._call = (what, time.monotonic())

    def end(self) -> None:
        """Marks the end of the call `begin` started; an interrupt still pending for it is withdrawn."""
        with self._lock:
            self._call = None
            if self._injected:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self._ident), None)
                self._injected = False

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
            if self._main:  # re-armed at each look: fires only when this thread has had no turn for `deadman` s
                _arm_deadman(deadman)
            call, now = self._call, time.monotonic()
            if call is None or now - call[1] < self.timeout_s:
                continue
            if self._interrupted != call:
                self._interrupt(call)
            elif now - call[1] >= self.timeout_s + self.grace_s:
                self._stuck(call)

    def _interrupt(self, call: tuple[str, float]) -> None:
        about = self.describe()
        self.message = (
            f"{self.env_id}: its {call[0]} did not return within {self.timeout_s:g} s ({about + '; ' if about else ''}"
            "--env-timeout sets the limit); the env hangs, or needs a longer limit"
        )
        frame = sys._current_frames().get(self._ident)
        stack = "".join(traceback.format_stack(frame)) if frame is not None else "(the thread has ended)\n"
        with self._lock:
            if self._call is not call:  # it ended meanwhile
                return
            log.error("%s. Where it hangs:\n%s", self.message, stack.rstrip("\n"))
            self._interrupted = call
            if self._main:  # a signal: it ends a blocking system call too
                signal.pthread_kill(self._ident, _SIGNAL)
            else:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self._ident), ctypes.py_object(EnvHang))
                self._injected = True

    def _stuck(self, call: tuple[str, float]) -> None:
        """An interrupted call that has not ended within the grace: another thread's is given up (the watch ends),
        the main thread's ends the process."""
        if not self._main:
            log.error("%s; it did not stop when interrupted within %g s more: given up.", self.message, self.grace_s)
            self._done.set()
            return
        log.critical(
            "%s; it did not stop when interrupted within %g s more, so this process ends (exit %d). Every thread's "
            "stack follows.",
            self.message,
            self.grace_s,
            EXIT_STUCK,
        )
        try:
            faulthandler.dump_traceback(file=_stderr(), all_threads=True)
        except (OSError, ValueError):  # no standard error to write to
            pass
        try:
            if self.on_stuck is not None:
                self.on_stuck()
        finally:
            sys.stderr.flush()
            os._exit(EXIT_STUCK)


def _stderr():
    """The process's standard error as faulthandler needs it (a file with a descriptor), whatever `sys.stderr`
    was replaced with."""
    return sys.__stderr__ if sys.__stderr__ is not None else 2


def _arm_deadman(seconds: float) -> None:
    """(Re-)arms faulthandler's timer that writes every stack and ends the process (exit 1) in `seconds`; left
    unarmed where standard error cannot take it."""
    try:
        faulthandler.dump_traceback_later(seconds, exit=True, file=_stderr())
    except (OSError, ValueError, RuntimeError):
        pass


class _Watched:
    """An env (single or batched) whose `reset`, `step`, `render` and `close` run under an `EnvWatch`; every other
    attribute is the env's own."""

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
        return self._call("reset()", self.env.reset, **kwargs)

    def step(self, action):
        return self._call("step()", self.env.step, action)

    def render(self):
        return self._call("render()", self.env.render)

    def close(self, **kwargs):
        """Closes the env; after a call that hung, a batched env's worker processes are ended rather than waited
        for (gymnasium's `terminate`), and a close that hangs as well is given up (logged)."""
        if not self._hung:
            return self._call("close()", self.env.close, **kwargs)
        extras = getattr(self.env, "close_extras", None)
        if extras is not None and "terminate" in inspect.signature(extras).parameters:
            kwargs = dict(kwargs, terminate=True)
        try:
            self._call("close()", self.env.close, **kwargs)
        except EnvHang:
            log.error("%s: its close() hung as well; given up.", self._watch.env_id)


def watched(env, watch: EnvWatch):
    """`env` with its `reset`, `step`, `render` and `close` under `watch` (`env` itself when the watch is off)."""
    return _Watched(env, watch) if watch.timeout_s > 0 else env
