"""The learner's book of actors: ids, heartbeats and env-step counts. Pure Python, no gRPC, no clock.

Counting never changes the book: actors without a heartbeat for `timeout_s` leave it only when
`evict_stale(now)` is called (the learner does once a second, and before every status reply). An actor that left
(timed out, or was connected to an earlier learner process whose checkpoint was restored) keeps its
place: when it comes back with the same id it is counted from where the count left it, so no env step
it took in between is lost and none is counted twice. Not thread-safe: the learner holds its lock around
every call.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from rlfleet.common.logs import logger

log = logger("learner")


@dataclasses.dataclass
class ActorRecord:
    """One actor in the book.

    env_steps: its cumulative env steps (its own count, from its heartbeats); steps_before: the part of
    them counted before it joined this book (0 for a new actor); last_seen: time of its last heartbeat
    (seconds, the caller's clock); policy_version: the version of the policy it acts with (-1: none yet);
    env_backend / env_backend_reason: the backend its envs step on and why ("" until its heartbeats say).
    """

    host: str
    address: str
    num_envs: int
    policy_version: int = -1
    env_steps: int = 0
    steps_before: int = 0
    last_seen: float = 0.0
    env_backend: str = ""
    env_backend_reason: str = ""


class ActorSeen(NamedTuple):
    """What an actor's heartbeat says of itself: its host name, its address as the learner sees it, its number
    of envs, and the env backend its envs step on and why ("": not said; the last said is kept)."""

    host: str = ""
    address: str = ""
    num_envs: int = 0
    env_backend: str = ""
    env_backend_reason: str = ""


UNSAID = ActorSeen()  # a heartbeat that says nothing of its actor


class ActorRegistry:
    """Actors by id; the env steps they took.

    Args:
        timeout_s: seconds without a heartbeat after which `evict_stale` removes an actor.
        base_env_steps: env steps of the run counted before this book (a restored checkpoint's).
        next_actor_id / away: a restored checkpoint's `progress()` (see there).
        restored: whether base_env_steps, next_actor_id and away come from a checkpoint. An unknown actor with
            an id from next_actor_id on then joined the run after that checkpoint: none of its env steps are in
            base_env_steps, so all of them count. Without a checkpoint an unknown actor (one of an earlier
            learner process whose state is gone) counts from its first heartbeat.
    """

    def __init__(
        self,
        timeout_s: float,
        base_env_steps: int = 0,
        next_actor_id: int = 0,
        away: dict | None = None,
        restored: bool = False,
    ):
        self.timeout_s = timeout_s
        self.base_env_steps = base_env_steps
        self.next_actor_id = next_actor_id
        self.actors: dict[int, ActorRecord] = {}
        self.departed_env_steps = 0  # counted steps of actors that left
        # Actors not in the book whose env steps up to some point are counted: {id: cumulative env steps}.
        self.away: dict[int, int] = dict(away or {})
        # Ids given out after the restored checkpoint start here (None: no checkpoint was restored).
        self.first_id_after_checkpoint = next_actor_id if restored else None

    def register(self, host: str, address: str, num_envs: int, now: float) -> int:
        """Adds a new actor; returns its id (never one that an actor that is away may come back with)."""
        actor_id = self.next_actor_id
        self.next_actor_id += 1
        self.actors[actor_id] = ActorRecord(host, address, num_envs, last_seen=now)
        return actor_id

    def heartbeat(
        self, actor_id: int, env_steps: int, policy_version: int, now: float, seen: ActorSeen = UNSAID
    ) -> bool:
        """Records a heartbeat of `env_steps` (the actor's count) on `policy_version` at monotonic time `now`, with
        what the actor says of itself (`seen`); an unknown id (an actor that was away) is re-admitted, counted
        from where it left: from its count in `away`, from 0 when it joined after the restored checkpoint, else
        from now. A count below the one it left with (the actor process restarted) counts from now. Returns True
        when it was re-admitted."""
        a = self.actors.get(actor_id)
        rejoined = a is None
        if rejoined:
            after_checkpoint = self.first_id_after_checkpoint is not None and actor_id >= self.first_id_after_checkpoint
            left_at = self.away.pop(actor_id, 0 if after_checkpoint else env_steps)
            before = min(left_at, env_steps)
            a = ActorRecord(seen.host, seen.address, seen.num_envs, env_steps=env_steps, steps_before=before)
            self.actors[actor_id] = a
            self.next_actor_id = max(self.next_actor_id, actor_id + 1)
        a.env_steps, a.policy_version, a.last_seen = env_steps, policy_version, now
        if seen.env_backend:
            a.env_backend, a.env_backend_reason = seen.env_backend, seen.env_backend_reason
        return rejoined

    def evict_stale(self, now: float) -> list[int]:
        """Removes actors without a heartbeat for more than `timeout_s`; returns their ids. Their env steps
        stay counted."""
        gone = [i for i, a in self.actors.items() if now - a.last_seen > self.timeout_s]
        for actor_id in gone:
            self.remove(actor_id)
            log.info("actor %d left the status list (no heartbeat for %.0fs)", actor_id, self.timeout_s)
        return gone

    def remove(self, actor_id: int) -> None:
        """Takes an actor out of the book (its env steps stay counted; it may come back)."""
        a = self.actors.pop(actor_id)
        self.departed_env_steps += a.env_steps - a.steps_before
        self.away[actor_id] = a.env_steps

    def env_steps(self) -> int:
        """The run's env steps as the actors reported them (earlier processes included); changes nothing."""
        here = sum(a.env_steps - a.steps_before for a in self.actors.values())
        return self.base_env_steps + self.departed_env_steps + here

    def snapshot(self, now: float) -> list[dict]:
        """The actors as `ActorStatus` fields (proto/rlfleet.proto), by id."""
        return [
            dict(
                actor_id=i,
                host=a.host,
                address=a.address,
                num_envs=a.num_envs,
                policy_version=a.policy_version,
                env_steps=a.env_steps,
                seconds_since_heartbeat=round(now - a.last_seen, 3),
                env_backend=a.env_backend,
                env_backend_reason=a.env_backend_reason,
            )
            for i, a in sorted(self.actors.items())
        ]

    def progress(self) -> dict:
        """What a checkpoint records: {"next_actor_id": int, "actor_env_steps": {id: cumulative env steps} of
        every actor connected or away}; `ActorRegistry(..., next_actor_id, away=actor_env_steps)` continues."""
        steps = {i: a.env_steps for i, a in self.actors.items()}
        steps.update(self.away)
        return dict(next_actor_id=self.next_actor_id, actor_env_steps=steps)
