"""Simulated actors: load on a learner without envs or replay writes (the load benchmark and its CI test).

Each simulated actor does what a real one does to the learner (`rlfleet.actors.actor.Actor`): it registers,
holds a StreamWeights stream for its whole life (parsing every `Weights` message it gets) and heartbeats every
`HEARTBEAT_S` seconds on a Heartbeats stream, on a gRPC connection of its own; it takes no env steps (its
heartbeats report 0) and writes nothing to replay. One process runs many of them on one asyncio loop.

    python -m rlfleet.loadgen.simulated_actors --learner HOST:PORT --actors 128 --seconds 60 --out stats.json

The stats file holds, per actor ("actors"), the heartbeat and registration latencies (seconds) and each weights
message it received after its first: [policy_version, published_at, received_at] (Unix seconds; the learner stamps
`published_at`), so that the time a version takes to reach every actor can be computed
(`fan_out_seconds`); and when this process's own event loop stalled ("loop_stalls", see `_watch_loop`).
SIGTERM/SIGINT end the run early; each actor sends a last heartbeat with `leaving` set.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import signal
import time

import grpc

from rlfleet.actors.heartbeats import HEARTBEAT_S
from rlfleet.common.files import atomic_write
from rlfleet.proto import rlfleet_pb2, rlfleet_pb2_grpc
from rlfleet.proto.arrays import GRPC_OPTIONS

# Each simulated actor gets its own connection, as actors on different machines would (gRPC otherwise shares
# one connection between channels of a process with the same target and arguments).
_OPTIONS = [*GRPC_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]


async def simulated_actor(address: str, index: int, until: float, stop: asyncio.Event, timeout_s: float = 30.0) -> dict:
    """One simulated actor against the learner at `address` until `until` (a `time.monotonic()` deadline) or
    `stop`; returns its stats {"actor_id", "register_s", "heartbeat_s": [seconds], "versions": [[version,
    published_at, received_at]] (after the first message), "opened_at" (first message), "closed_at", "errors":
    [str]} (published_at, received_at, opened_at and closed_at in Unix seconds, to compare with the learner's
    `published_at`; register_s and heartbeat_s are durations measured with the monotonic clock)."""
    await asyncio.sleep(random.random() * HEARTBEAT_S)  # actors start at different times
    async with grpc.aio.insecure_channel(address, options=_OPTIONS) as ch:
        actor = _SimulatedActor(rlfleet_pb2_grpc.LearnerStub(ch), index, stop, timeout_s)
        if await actor.register():
            await actor.live(until)
    return actor.stats


class _SimulatedActor:
    """The calls of one simulated actor on its own connection (`simulated_actor`)."""

    def __init__(self, stub, index: int, stop: asyncio.Event, timeout_s: float):
        self.stub, self.index, self.stop, self.timeout_s = stub, index, stop, timeout_s
        self.stats = dict(
            actor_id=-1, register_s=None, heartbeat_s=[], versions=[], errors=[], opened_at=None, closed_at=0.0
        )
        self.beats = None  # the Heartbeats stream (opened again after a failure)

    async def register(self) -> bool:
        t0 = time.monotonic()
        try:
            resp = await self.stub.RegisterActor(
                rlfleet_pb2.RegisterActorRequest(host=f"simulated-{self.index}", actor_name="simulated"),
                timeout=self.timeout_s,
                wait_for_ready=True,
            )
        except grpc.aio.AioRpcError as e:
            self.stats["errors"].append(f"register: {e.code().name}")
            return False
        self.stats["register_s"] = time.monotonic() - t0
        self.stats["actor_id"] = resp.actor_id
        return True

    async def weights(self) -> None:
        """Holds the StreamWeights stream, recording when each version arrived."""
        stats = self.stats
        try:
            request = rlfleet_pb2.StreamWeightsRequest(actor_id=stats["actor_id"])
            async for msg in self.stub.StreamWeights(request):
                if stats["opened_at"] is None:  # the first is whatever was latest when the stream opened
                    stats["opened_at"] = time.time()
                else:
                    stats["versions"].append([msg.policy_version, msg.published_at, time.time()])
        except grpc.aio.AioRpcError as e:
            if not self.stop.is_set() and e.code() != grpc.StatusCode.CANCELLED:
                stats["errors"].append(f"weights: {e.code().name}")

    async def beat(self, leaving: bool = False) -> bool:
        """One heartbeat on the Heartbeats stream (opened again after a failure); returns the learner's stop."""
        t = time.monotonic()
        request = rlfleet_pb2.HeartbeatRequest(
            actor_id=self.stats["actor_id"], host=f"simulated-{self.index}", leaving=leaving
        )
        try:
            if self.beats is None or self.beats.done():  # none yet, or it ended since the last (learner restart)
                self.beats = self.stub.Heartbeats()
            async with asyncio.timeout(self.timeout_s):
                await self.beats.write(request)
                r = await self.beats.read()
            if r is grpc.aio.EOF:
                raise ConnectionError("the heartbeat stream ended before the reply")
            self.stats["heartbeat_s"].append(time.monotonic() - t)
            return r.stop
        except (grpc.aio.AioRpcError, TimeoutError, ConnectionError, asyncio.InvalidStateError) as e:
            self.stats["errors"].append(f"heartbeat: {e.code().name if hasattr(e, 'code') else type(e).__name__}")
            if self.beats is not None:
                self.beats.cancel()
            self.beats = None
            return False

    async def live(self, until: float) -> None:
        """Streams weights and heartbeats every `HEARTBEAT_S` until `until` (a `time.monotonic()` deadline),
        `stop` or the learner's stop; then a last heartbeat with `leaving` set."""
        stream = asyncio.create_task(self.weights())
        while time.monotonic() < until and not self.stop.is_set():
            try:
                await asyncio.wait_for(self.stop.wait(), HEARTBEAT_S)
            except asyncio.TimeoutError:
                pass
            if self.stop.is_set() or await self.beat():
                break
        self.stats["closed_at"] = time.time()
        await self.beat(leaving=True)
        if self.beats is not None:
            self.beats.cancel()
        stream.cancel()
        try:
            await stream
        except asyncio.CancelledError:
            pass


_STALL_PERIOD_S = 0.05  # seconds between the loop watcher's checks


async def _watch_loop(
    stalls: list, stop: asyncio.Event, period_s: float = _STALL_PERIOD_S, threshold_s: float = 0.25
) -> None:
    """Appends [Unix time, seconds] to `stalls` whenever this process's event loop ran more than `threshold_s`
    late: the client's own delays, which its heartbeat and fan-out times then include. The lateness is measured
    with the monotonic clock; the Unix time (when the late sleep began) is kept to compare with `published_at`."""
    while not stop.is_set():
        stamp, t = time.time(), time.monotonic()
        await asyncio.sleep(period_s)
        late = time.monotonic() - t - period_s
        if late > threshold_s:
            stalls.append([stamp, round(late, 3)])


async def run(address: str, actors: int, seconds: float, first_index: int = 0) -> dict:
    """Runs `actors` simulated actors for `seconds` (or until SIGTERM/SIGINT); returns {"actors": [their stats],
    "loop_stalls": [[Unix time, seconds] when this process's event loop was late by more than 0.25 s]}."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    until = time.monotonic() + seconds
    stalls: list = []
    watch = asyncio.create_task(_watch_loop(stalls, stop))
    stats = await asyncio.gather(*(simulated_actor(address, first_index + i, until, stop) for i in range(actors)))
    stop.set()
    await watch
    return {"actors": list(stats), "loop_stalls": stalls}


def read_stats(paths: list[str]) -> tuple[list[dict], list[list[float]]]:
    """The actors' stats and the loop stalls of the stats files `paths` (written by this module's `main`)."""
    actors, stalls = [], []
    for path in paths:
        with open(path) as f:
            d = json.load(f)
        actors += d["actors"]
        stalls += d["loop_stalls"]
    return actors, stalls


def slow_during_stalls(
    actors: list[dict],
    stalls: list[list[float]],
    fan_out: dict[int, float],
    limit_s: float = 1.0,
    period_s: float = _STALL_PERIOD_S,
) -> int:
    """How many versions whose fan-out (`fan_out_seconds(actors)`) took more than `limit_s` overlapped a stall of
    a client loop: a stall that overlaps [publication, publication + fan-out] delayed that version on the client's
    side. A stall recorded as [t, late] lies within [t, t + period_s + late] (`_watch_loop`'s sleep of
    `period_s`)."""
    published = {v: t for s in actors for v, t, _ in s["versions"]}
    return sum(
        any(start < published[v] + took and start + period_s + late > published[v] for start, late in stalls)
        for v, took in fan_out.items()
        if took > limit_s
    )


def fan_out_seconds(stats: list[dict], settle_s: float = 5.0) -> dict[int, float]:
    """For each policy version received: the seconds from its publication until every actor that held a stream
    then (and still did `settle_s` later) held it or a newer one; inf when one of them never did. {version:
    seconds}."""
    published = {v: t for s in stats for v, t, _ in s["versions"]}
    out = {}
    for version, t_pub in sorted(published.items()):
        slowest = 0.0
        for s in stats:
            if s["opened_at"] is None or not (s["opened_at"] < t_pub and s["closed_at"] > t_pub + settle_s):
                continue
            got = [r for v, _, r in s["versions"] if v >= version]
            slowest = max(slowest, min(got) - t_pub) if got else math.inf
        out[version] = slowest
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--learner", required=True, help="learner host:port")
    p.add_argument("--actors", type=int, required=True, help="simulated actors in this process")
    p.add_argument("--seconds", type=float, required=True, help="how long they stay attached (seconds)")
    p.add_argument("--first-index", type=int, default=0, help="index of the first (their hosts are simulated-N)")
    p.add_argument("--out", required=True, help="stats JSON file to write")
    a = p.parse_args(argv)
    stats = asyncio.run(run(a.learner, a.actors, a.seconds, a.first_index))
    atomic_write(a.out, json.dumps(stats))


if __name__ == "__main__":
    main()
