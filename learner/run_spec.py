"""What one learner process is told (`RunSpec`): what it trains, where its data is, and how it serves. The
learner (`rlfleet.learner.service.Learner`) and its parts are built from it."""

from __future__ import annotations

import dataclasses

from rlfleet.algorithms.settings import RunSettings
from rlfleet.envs import ENV_TIMEOUT_S

ACTOR_TIMEOUT_S = 30.0  # default: an actor without heartbeat for this long leaves the status list
# Default: how long a starting learner waits for its settings file and the replay servers, in all (seconds). Under
# an engine with no start order (Swarm, Kubernetes) the replay server may start after the learner.
START_TIMEOUT_S = 300.0
WAIT_REPORT_S = 5.0  # seconds between the log lines of a learner that waits to start (settings, replay server)


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """Everything one learner process is told: what it trains, where its data is, and how it serves.

    Attributes:
        settings: what the run trains (`RunSettings`: algorithm, env, resolved config, teacher), with its seed
            (actors' env seeds and the networks' initialisation follow from it) and its budget in env steps
            (`total_steps`; 0: run until stopped).
        replay_address: host:port of the Reverb server holding the algorithm's table.
        logdir: run directory (checkpoints/, tb/, metrics.jsonl, summary.json).
        resume: a run directory whose latest checkpoint to continue from.
        replay_sources: {name: host:port} of the replay servers of the algorithm's `ReplaySource`s
            (`AlgorithmBuilder.replay_sources`; QDagger: "teacher", served by `rlfleet replay --teacher DIR`).
        replay_for_actors: the replay address as actors should dial it (None: `replay_address`).
        env_backend: the actors' env backend (`rlfleet.envs.core.BACKENDS`, or "auto").
        env_timeout_s: seconds one env call (reset, step) may take, in the learner's evaluations and on the actors
            it is sent to, before it is reported as hung (`rlfleet.envs.watch.EnvWatch`; 0: no limit).
        port / bind: where the gRPC service listens (port 0: a free one).
        tls: (cert PEM path, key PEM path, client CA PEM path or None) to serve TLS; None: plaintext.
        token: shared token every `rlfleet.Learner` call must carry ("" = none; `rlfleet.proto.security`).
        report_interval_s: seconds between metrics rows; checkpoint_interval_s: seconds between checkpoints.
        linger_s: the most seconds the finished learner keeps answering status before it exits (less once the
            actors and the replay server have stopped).
        linger_for_replay: whether the linger also waits for the run's replay server to stop (it stops by itself
            once it sees the run's end); False where a supervisor stops it after the learner (`rlfleet up`): the
            linger then ends once every actor has left.
        actor_timeout_s: seconds without a heartbeat after which an actor leaves the status list (its env
            steps stay counted; a heartbeat later re-admits it).
        start_timeout_s / start_deadline: the learner waits for the replay servers to answer until the monotonic
            time `start_deadline` (None: `start_timeout_s` seconds from when it starts to wait), the end of
            its --start-timeout of `start_timeout_s` seconds, counted from the process's start.
        video_every: after every this many evaluations, one evaluation episode again as a video in RUN/videos and
            TensorBoard (`rlfleet.algorithms.library.evaluation.EvaluationVideos`; 0: none).
        track: experiment trackers that also get the metrics rows (`rlfleet.learner.trackers.TRACKERS`), beside
            those the run directory recorded.
    """

    settings: RunSettings
    replay_address: str
    logdir: str
    resume: str | None = None
    replay_sources: dict = dataclasses.field(default_factory=dict)
    replay_for_actors: str | None = None
    env_backend: str = "auto"
    env_timeout_s: float = ENV_TIMEOUT_S
    port: int = 0
    bind: str = "127.0.0.1"
    tls: tuple | None = None
    token: str = ""
    report_interval_s: float = 5.0
    checkpoint_interval_s: float = 120.0
    linger_s: float = 0.0
    linger_for_replay: bool = True
    actor_timeout_s: float = ACTOR_TIMEOUT_S
    start_timeout_s: float = START_TIMEOUT_S
    start_deadline: float | None = None
    video_every: int = 0
    track: tuple = ()
