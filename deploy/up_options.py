"""What `rlfleet up` is told besides the run's settings (`UpOptions`), and the command that resumes a run. Imports
nothing heavy: the command line builds it before it imports the launcher (`rlfleet.deploy.launcher`)."""

from __future__ import annotations

import dataclasses
import shlex

from rlfleet.envs import ENV_TIMEOUT_S

LOOPBACK = "127.0.0.1"


@dataclasses.dataclass(frozen=True)
class UpOptions:
    """How `launch` runs a run on this machine: what `rlfleet up` is told besides the run's settings.

    Attributes:
        logdir: the run directory.
        num_actors: actor processes.
        learner_port: the learner's port (0: a free one).
        bind: the address the learner listens on (loopback; another address lets actors on other machines
            attach, and the replay server is announced to actors at that address too).
        env_backend: the actors' env backend ("auto", or one of `rlfleet.envs.ENV_BACKENDS`).
        env_timeout_s: seconds one env call may take before it is reported as hung (the learner's `--env-timeout`).
        resume: a run directory whose latest checkpoint to continue from (None: a new run).
        report_interval: seconds between progress rows (and the learner's metrics rows).
        video_every: the learner's `--video-every` (0: no videos).
        advertise: the address of this machine that actors on other machines reach it at (`--advertise`), told
            to them for the replay server; None: `bind` where it is one address, else what this machine's host name
            resolves to.
        track: experiment trackers of `--track` (the learner is given them through $RLFLEET_TRACK, which `up`
            sets).
    """

    logdir: str
    num_actors: int = 1
    learner_port: int = 0
    bind: str = LOOPBACK
    env_backend: str = "auto"
    env_timeout_s: float = ENV_TIMEOUT_S
    resume: str | None = None
    report_interval: float = 5.0
    video_every: int = 0
    advertise: str | None = None
    track: tuple = ()


def resume_command(options: UpOptions) -> str:
    """The `rlfleet up --resume LOGDIR` command line that continues a run (its algorithm, env, settings, seed and
    budget come from LOGDIR/run.json) with the same actors, address, env backend and videos, shell-quoted
    (`shlex.join`): pasted into a POSIX shell it passes the path unchanged."""
    o = options
    argv = ["rlfleet", "up", "--resume", str(o.logdir), "--actors", str(o.num_actors)]
    argv += ["--bind", o.bind] if o.bind != LOOPBACK else []
    argv += ["--advertise", o.advertise] if o.advertise else []
    argv += ["--env-backend", o.env_backend] if o.env_backend != "auto" else []
    argv += ["--env-timeout", f"{o.env_timeout_s:g}"] if o.env_timeout_s != ENV_TIMEOUT_S else []
    argv += ["--video-every", str(o.video_every)] if o.video_every else []
    return shlex.join(argv)
