"""What the learner shows of its run: the `Status` message (proto/rlfleet.proto, the GetStatus RPC and
`rlfleet status`) and the rows of metrics.jsonl, built from the run's counters and its `RunStatus`."""

from __future__ import annotations

import collections
import math
import time

import numpy as np

from rlfleet.proto import rlfleet_pb2

RECENT_EPISODES = 100  # episode_return_mean is over this many recent training episodes
# Phases of a learner that is still starting: it answers status but does not serve its actors yet.
STARTING_PHASES = ("starting", "waiting_for_settings", "waiting_for_replay")


class RunStatus:
    """The run's state that status shows beside its counters and actors: phase, fault, whether it finished,
    recent training returns, the last evaluation, throughput and time.

    The learner's lock (`rlfleet.learner.service.Learner.lock`) guards them: every write is made under it except
    that of `rates`, which only the training thread writes, and the other threads read them under it.

    Args:
        algo, env_id: the run's algorithm and env (status shows them).
        earlier_wall_s: seconds the run trained in earlier processes (up to the checkpoint it resumed from).
        earlier_eval_s: of those, the seconds its evaluations took.
    """

    def __init__(self, algo: str, env_id: str, earlier_wall_s: float = 0.0, earlier_eval_s: float = 0.0):
        self.algo, self.env_id = algo, env_id
        self.phase = "waiting_for_actors"
        self.waiting_for = ""  # while the phase is waiting_for_replay: the replay server's host:port
        self.fault = ""  # why the learner stopped with an error
        self.finished = False  # the run is over for good and summary.json written
        self.start_time = time.monotonic()
        self.earlier_wall_s = earlier_wall_s
        # Wall seconds the run spent in its evaluations, all processes (a part of `wall_seconds`).
        self.evaluation_seconds = earlier_eval_s
        self.recent_returns: collections.deque = collections.deque(maxlen=RECENT_EPISODES)
        self.eval_return_mean = math.nan
        self.eval_env_steps: int | None = None  # the run's env steps when that evaluation ran (None: none yet)
        # Measured at each metrics row (`measure_rates`); NaN ("-" on status) until the first one.
        self.rates = {"env_steps_per_second": math.nan, "learner_steps_per_second": math.nan}

    def wall_seconds(self, now: float) -> float:
        """Seconds this run has trained at monotonic time `now`, summed over its processes (a resumed run
        continues the count)."""
        return self.earlier_wall_s + now - self.start_time

    def fields(self, count: dict, env_steps: int, actors: list[dict], now: float, extras: dict) -> dict:
        """The fields of the `Status` message but `replay`, as plain Python values.

        Args:
            count: the learner's counters (learner_steps, policy_version, consumed_env_steps, dropped_env_steps).
            env_steps: the run's env steps; actors: `ActorRegistry.snapshot` rows; now: monotonic seconds.
            extras: the agent's `status_extras()`; its "phase", if any, replaces the run's while it trains.
        """
        recent = list(self.recent_returns)
        out = dict(
            algo=self.algo,
            env_id=self.env_id,
            phase=self.phase,
            waiting_for=self.waiting_for,
            fault=self.fault,
            finished=self.finished,
            learner_steps=count["learner_steps"],
            env_steps=env_steps,
            policy_version=count["policy_version"],
            weights_version=count["policy_version"],  # the same, under the status contract's name
            episode_return_mean=float(np.mean(recent)) if recent else math.nan,
            eval_return_mean=self.eval_return_mean,
            uptime_seconds=now - self.start_time,
            actors=actors,
            dropped_env_steps=count["dropped_env_steps"],
            consumed_env_steps=count["consumed_env_steps"],
            **self.rates,
        )
        extras = dict(extras)
        phase = extras.pop("phase", None)  # an algorithm's own phase (QDagger: offline_pretraining, online)
        if phase and self.phase in ("training", "waiting_for_actors"):
            out["phase"] = phase  # evaluating / stopping / done / failed describe the run's end
        out.update(extras)
        out["algorithm_values"] = {k: float(v) for k, v in extras.items()}
        return out

    def measure_rates(self, st: dict, last: dict, now: float) -> None:
        """Sets `rates` from the status dict `st` and the counts of the last metrics row, `last` (time,
        env_steps, learner_steps), taken at monotonic time `now`."""
        dt = max(now - last["time"], 1e-6)
        self.rates = {
            "env_steps_per_second": (st["env_steps"] - last["env_steps"]) / dt,
            "learner_steps_per_second": (st["learner_steps"] - last["learner_steps"]) / dt,
        }

    def metrics_row(self, st: dict, now: float, last_metrics: dict) -> dict:
        """One row of metrics.jsonl from the status dict `st` taken at monotonic time `now`, with the last
        update's metrics (`StepResult.metrics`, those not among the algorithm's status values)."""
        extras = st["algorithm_values"]  # e.g. QDagger's distillation coefficient
        return dict(
            time=time.time(),  # for people: the wall clock; intervals and rates use the monotonic one
            wall_seconds=self.wall_seconds(now),
            phase=st["phase"],
            **counts(st),
            **extras,
            episode_return_mean=st["episode_return_mean"],
            eval_return_mean=st["eval_return_mean"],
            eval_env_steps=self.eval_env_steps,
            evaluation_seconds=self.evaluation_seconds,
            num_actors=len(st["actors"]),
            **self.rates,
            **{k: v for k, v in last_metrics.items() if k not in extras},
        )

    def update_row(self, count: dict, env_steps: int, now: float, update_metrics: dict) -> dict:
        """The metrics.jsonl row of one update (an agent with `metrics_every_update`): its metrics
        (`StepResult.metrics`) with the counters after it (`count`: the learner's counters; `env_steps`: the
        run's), at monotonic time `now`."""
        return dict(
            time=time.time(),
            wall_seconds=self.wall_seconds(now),
            **counts(dict(count, env_steps=env_steps)),
            **update_metrics,
        )


def counts(st: dict) -> dict:
    """The run's counters in a status dict, as metrics rows and summary.json name them."""
    return dict(
        env_steps=st["env_steps"],
        learner_steps=st["learner_steps"],
        policy_version=st["policy_version"],
        weights_version=st["policy_version"],  # the same, under the status contract's name
        consumed_env_steps=st["consumed_env_steps"],
        dropped_env_steps=st["dropped_env_steps"],
    )


def status_message(st: dict) -> rlfleet_pb2.Status:
    """The `Status` message of a status dict (`RunStatus.fields` with `replay`)."""
    # Scalar fields of the message; an algorithm's own values beyond them travel in algorithm_values only.
    scalars = {k for k in rlfleet_pb2.Status.DESCRIPTOR.fields_by_name} - {"actors", "replay", "algorithm_values"}
    msg = rlfleet_pb2.Status(**{k: v for k, v in st.items() if k in scalars})
    msg.algorithm_values.update(st["algorithm_values"])
    for a in st["actors"]:
        msg.actors.add(**a)
    for t in st["replay"]:
        msg.replay.add(**t)
    return msg
