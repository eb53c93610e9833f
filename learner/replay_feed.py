"""The learner's side of the replay server: the startup checks of its tables, the samples the training loop
consumes, and the copy of the tables' counters that status shows.

Samples are read on a thread of their own (`ReplayFeed.start`, thread "sampler") into a small local queue; when
the replay server goes away (restart, crash) that thread reconnects with backoff for up to `REPLAY_OUTAGE_S`
seconds before it gives up, and the training loop's next `ReplayFeed.take` raises.
"""

from __future__ import annotations

import queue
import threading
import time

import reverb

from rlfleet.common.logs import logger
from rlfleet.learner.errors import LearnerError, LearnerStopped
from rlfleet.learner.run_spec import WAIT_REPORT_S
from rlfleet.replay.server import table_status

log = logger("learner")

REPLAY_OUTAGE_S = 300.0  # how long the learner waits for a lost replay server to come back


class ReplayFeed:
    """The replay tables of one learner: checked at startup, sampled on the sampler thread, counted for status.

    Args:
        agent: the run's `Agent` (`rlfleet.algorithms.base`): its table, signature, `samples` and `prefetch`.
        address: host:port of the run's replay server.
        sources: the run's other replays (`ReplaySource`s with their addresses; QDagger: its teacher's).
        stop_event: set when the learner stops; the sampler thread ends with it.
    """

    def __init__(self, agent, address: str, sources: tuple, stop_event: threading.Event):
        self.agent, self.address, self.sources = agent, address, sources
        self.stop_event = stop_event
        self._queue: queue.Queue = queue.Queue(maxsize=agent.prefetch)
        self._error: Exception | None = None  # why the sampler thread gave up
        self._tables: list[dict] = []
        self.last_answer: float | None = None  # monotonic time the run's replay server last answered `refresh_status`

    def check_tables(
        self, algo: str, env_id: str, envs_per_actor: int, deadline: float, timeout_s: float, waiting=None
    ) -> None:
        """Waits until the monotonic time `deadline` (the end of a --start-timeout of `timeout_s` seconds) for the
        replay servers to answer (a line on stdout every `WAIT_REPORT_S` seconds), then checks that each holds the
        agent's table with the agent's signature (`algo` on `env_id` with `envs_per_actor` envs: for the message).

        Args:
            waiting: called with each server's host:port before it is waited for (status shows it).
        Raises:
            LearnerStopped: `stop_event` was set while it waited.
            LearnerError: a server that did not answer in time, or without the table, or with a table of another
                signature; the message says how to start it.
        """
        learner = f"the learner ({algo} on {env_id}, {envs_per_actor} envs per actor)"
        servers = [(self.address, f"rlfleet replay --algo {algo}", None)]
        servers += [(s.address, f"rlfleet replay --teacher {s.run_dir}", s.name) for s in self.sources]
        for address, start_hint, source in servers:
            if waiting is not None:
                waiting(address)
            info = self._server_info(address, start_hint, deadline, timeout_s)
            self._check_table(info, address, start_hint, source, learner)

    def _check_table(self, info: dict, address: str, start_hint: str, source: str | None, learner: str) -> None:
        """Checks the agent's table in the `info` of the server at `address` (`source`: the replay source it
        serves, None: the run's own); raises LearnerError with `start_hint` when it is missing or differs."""
        table = self.agent.table
        if table not in info:
            raise LearnerError(
                f"replay server {address} has no table {table!r} "
                f"(tables: {sorted(info)}); start it with `{start_hint}`."
            )
        problem = self.agent.signature_error(info[table].signature, source)
        if problem:
            whose = "" if source is None else f" (the {source} replay)"
            raise LearnerError(
                f"replay table {table} at {address}{whose}: its signature "
                f"does not match {learner}: {problem}. "
                "Start `rlfleet replay` and `rlfleet learner` with the same --algo, --env, --config and --set "
                "values (for another run's replay, e.g. a teacher's: the same n_step)."
            )

    def _server_info(self, address: str, start_hint: str, deadline: float, timeout_s: float) -> dict:
        """The replay server's {table name: table info}, waiting for it until the monotonic `deadline` (the end
        of the --start-timeout of `timeout_s` seconds), with a line every `WAIT_REPORT_S` seconds."""
        start = next_report = time.monotonic()
        while True:
            if self.stop_event.is_set():
                raise LearnerStopped(f"stopped while waiting for the replay server {address}")
            try:
                return reverb.Client(address).server_info(timeout=max(1, min(5, int(deadline - time.monotonic()))))
            except Exception as e:
                now = time.monotonic()
                if now >= deadline:
                    reason = str(e).splitlines()[0] if str(e) else type(e).__name__
                    raise LearnerError(
                        f"the replay server {address} did not answer within the learner's --start-timeout of "
                        f"{timeout_s:.0f} s ({reason}); start it with `{start_hint}`, or allow more time with "
                        "--start-timeout."
                    ) from e
                if now >= next_report:
                    log.info(
                        "waiting for the replay server %s (%.0f s; gives up %.0f s from now)",
                        address,
                        now - start,
                        deadline - now,
                    )
                    next_report = now + WAIT_REPORT_S
                self.stop_event.wait(min(1.0, max(0.0, deadline - now)))

    def start(self) -> None:
        """Starts the sampler thread (a daemon: it ends with `stop_event`, or when the server is lost for good)."""
        threading.Thread(target=self._sample_loop, daemon=True, name="sampler").start()

    def take(self, timeout_s: float):
        """The next sample (what the agent's `samples` yields).

        Raises:
            queue.Empty: none arrived within `timeout_s` seconds.
            LearnerError: the replay server was lost for longer than `REPLAY_OUTAGE_S`.
        """
        if self._error is not None:
            raise LearnerError(
                f"lost the replay server {self.address} for more than "
                f"{REPLAY_OUTAGE_S:.0f}s: {self._error}; restart it (an algorithm that keeps "
                "its replay: with the same --checkpoint-dir, so that it restores its tables) and "
                "resume this run with --resume."
            )
        return self._queue.get(timeout=timeout_s)

    def _sample_loop(self) -> None:
        """Feeds the queue from the replay server; when the server goes away it reconnects with backoff for up
        to REPLAY_OUTAGE_S seconds before giving up."""
        lost_since, backoff = None, 0.5
        while not self.stop_event.is_set():
            try:
                for sample in self.agent.samples(self.address):
                    if lost_since is not None:
                        log.warning("replay server %s is back", self.address)
                    lost_since, backoff = None, 0.5
                    self._put(sample)
                    if self.stop_event.is_set():
                        return
                return
            except Exception as e:  # replay unreachable or restarted
                if self.stop_event.is_set():
                    return
                if lost_since is None:
                    lost_since = time.monotonic()
                    log.warning(
                        "lost the replay server %s (%s); reconnecting for up to %.0fs", self.address, e, REPLAY_OUTAGE_S
                    )
                elif time.monotonic() - lost_since > REPLAY_OUTAGE_S:
                    self._error = e  # the training loop's next `take` reports it
                    return
                self.stop_event.wait(backoff)
                backoff = min(2 * backoff, 5.0)

    def _put(self, sample) -> None:
        """Puts `sample` on the queue once there is room, or drops it when the learner stops first."""
        while not self.stop_event.is_set():
            try:
                self._queue.put(sample, timeout=0.5)
                return
            except queue.Full:
                continue

    def refresh_status(self) -> None:
        """Reads the replay tables' sizes and counters (status shows this copy, so GetStatus never waits on the
        replay server; this may take seconds when a server is away)."""
        tables = table_status(self.address, timeout_s=3)
        if tables:
            self.last_answer = time.monotonic()
        for s in self.sources:
            tables += [dict(t, table=f"{s.name}/{t['table']}") for t in table_status(s.address, timeout_s=3)]
        self._tables = tables

    def tables(self) -> list[dict]:
        """The last copy of the tables' status (`rlfleet.replay.server.table_status` rows; a replay source's tables
        named SOURCE/TABLE, e.g. teacher/dqn_replay)."""
        return list(self._tables)
