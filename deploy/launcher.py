"""`rlfleet up`: the whole cluster as local OS processes on loopback ports.

Starts `rlfleet replay`, `rlfleet learner` and K `rlfleet actor` processes (the
same commands docker-compose runs), prints the learner address, shows progress
until the learner reaches the env-step budget and finishes its final
evaluation, then stops everything. A child that dies makes `up` fail with that
child's log; Ctrl-C stops the actors, lets the learner checkpoint, stops replay.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time

import portpicker

from rlfleet import algorithms
from rlfleet.actors.actor import EXIT_STOPPED
from rlfleet.algorithms.base import AlgorithmBuilder
from rlfleet.algorithms.settings import RunSettings
from rlfleet.common import run_lock
from rlfleet.common.addresses import bind_problem, host_port, is_wildcard, routable_address
from rlfleet.common.files import StorageError, check_writable
from rlfleet.common.logs import RELAYED_LEVELS, line_level, logger
from rlfleet.common.parent import PARENT_PID_ENV
from rlfleet.deploy.status import StatusError, check_health, get_status
from rlfleet.deploy.up_options import LOOPBACK, UpOptions, resume_command
from rlfleet.envs.core import EnvError, env_spec
from rlfleet.learner.run_dir import SETTINGS_FILE, check_run_dir, run_state, write_json
from rlfleet.learner.run_spec import START_TIMEOUT_S
from rlfleet.proto.security import ClientSecurity, token_from_env
from rlfleet.replay.checkpoints import REPLAY_SUBDIR

log = logger("up")

REPLAY_READY_S = 300.0  # how long `up` waits for a replay server to answer (restoring a large checkpoint takes time)
LEARNER_READY_S = 180.0  # how long `up` waits for the learner to answer once its replay servers do


class LaunchError(RuntimeError):
    """`up` could not start or lost a process; the message names the cause."""


class _Child:
    def __init__(self, name: str, args: list[str], logdir: str, lock: int | None = None):
        """Starts `rlfleet ARGS` as this process's child `name`, its output in LOGDIR/logs/NAME.log; `lock`: the
        run directory's lock (`rlfleet.common.run_lock.hold`) for a child that writes the run directory too."""
        shared = run_lock.inheritable(lock)
        self.name = name
        self.log_path = os.path.join(logdir, "logs", f"{name}.log")
        self.log = open(self.log_path, "ab")  # a resumed run appends to the same log
        self.log_start = self.relayed_to = self.log.tell()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rlfleet.deploy.cli", *args],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches `up` alone, which stops the children in order
            env=dict(os.environ, **{PARENT_PID_ENV: str(os.getpid())}, **shared["env"]),
            pass_fds=shared["pass_fds"],
        )

    def relay(self) -> None:
        """Prints the lines this process logged since the last call that a person running `up` must see: those
        at the levels `rlfleet.common.logs.RELAYED_LEVELS` (notices such as where a resumed run resumed from and
        the progress of long waits; warnings; errors)."""
        with open(self.log_path, "rb") as f:
            f.seek(self.relayed_to)
            text = f.read()
        end = text.rfind(b"\n") + 1  # whole lines only; the rest is read next time
        self.relayed_to += end
        for line in text[:end].decode(errors="replace").splitlines():
            if line_level(line) in RELAYED_LEVELS:
                print(line, flush=True)

    def tail(self, n: int = 25) -> str:
        """The last `n` lines this process wrote (not those of an earlier start of the run)."""
        with open(self.log_path, "rb") as f:
            f.seek(self.log_start)
            return "\n".join(f.read().decode(errors="replace").splitlines()[-n:])

    def stop(self, timeout: float) -> None:
        _stop_together([self], timeout)


def _stop_together(children: list[_Child], timeout: float) -> None:
    """SIGTERM to every child at once, then waits up to `timeout` seconds in all for them to exit; SIGKILL for
    those still running."""
    for c in children:
        if c.proc.poll() is None:
            c.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for c in children:
        try:
            c.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            c.proc.kill()
            c.proc.wait()
        c.log.close()


def _fail_child(child: _Child) -> LaunchError:
    return LaunchError(
        f"the {child.name} process exited with code {child.proc.returncode}; "
        f"last lines of {child.log_path}:\n{child.tail()}"
    )


def _wait_until(ready, children: list[_Child], what: str, timeout: float, log_path: str | None = None) -> None:
    """Waits until `ready()` (relaying the children's output), for at most `timeout` seconds.

    Raises:
        LaunchError: a child exited first (with its last lines), or `what` was not ready in time (naming
            `log_path`, by default the last child's log).
    """
    deadline = time.monotonic() + timeout
    while not ready():
        for c in children:
            c.relay()
            if c.proc.poll() is not None:
                raise _fail_child(c)
        if time.monotonic() > deadline:
            log = log_path or children[-1].log_path
            raise LaunchError(f"{what} did not become ready within {timeout:.0f}s; see {log}")
        time.sleep(0.3)


def _interrupt(signum, frame):
    """SIGINT (Ctrl-C), SIGTERM and SIGHUP to `up` stop the cluster cleanly."""
    raise KeyboardInterrupt


def _fmt(x, fmt="{:,.1f}") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


def progress_line(st: dict, total_steps: int) -> str:
    """One progress row for people: env steps, speed, learner steps, returns."""
    return (
        f"[{st['uptime_seconds']:7.1f}s] {st['phase']:<10} env steps {st['env_steps']:>10,}/{total_steps:,} "
        f"({_fmt(st['env_steps_per_second'], '{:,.0f}')}/s) | learner steps {st['learner_steps']:,} | "
        f"policy v{st['policy_version']} | return {_fmt(st['episode_return_mean'])} | "
        f"eval {_fmt(st['eval_return_mean'])}"
        + (f" | dropped (policy lag) {st['dropped_env_steps']:,}" if st.get("dropped_env_steps") else "")
        + "".join(f" | {label} {value}" for label, value in _progress_values(st))
    )


def _progress_values(st: dict) -> list[tuple[str, str]]:
    """(label, formatted value) of the status values the algorithm shows in progress rows
    (`AlgorithmBuilder.progress_values`)."""
    try:
        shown = algorithms.get(st["algo"]).progress_values
    except (ValueError, ImportError):
        return []
    values = st.get("algorithm_values") or {}
    return [(label, _fmt(values[k], fmt)) for k, (label, fmt) in shown.items() if k in values]


@dataclasses.dataclass
class LaunchPlan:
    """What `launch` checked and chose before starting anything: the run's settings and options, the
    addresses of its processes and the command that resumes it."""

    run: RunSettings  # with its seed and budget
    options: UpOptions
    algorithm: AlgorithmBuilder
    security: ClientSecurity
    resume_cmd: str
    replay_address: str
    advertised: str | None  # the host actors are told for the replay server (None: its loopback address)
    sources: tuple  # the algorithm's `ReplaySource`s, each with the address its read-only replay server gets
    learner_port: int
    learner_address: str
    settings_path: str  # RUN/settings.json: the resolved settings every process reads


def _plan(run: RunSettings, options: UpOptions) -> LaunchPlan:
    """Checks `launch`'s arguments (see there) and the run directory, and picks the ports.

    Raises:
        LaunchError: bad env/teacher/token, a run directory that conflicts or cannot be written, or an address
            the learner cannot listen on.
    """
    o = options
    try:
        algorithm = algorithms.get(run.algo)
        spec = env_spec(run.env_id)
        algorithms.require_action_kind(spec, run.algo)
        if run.teacher:
            algorithm.check_teacher(run.teacher, spec, run.config)
        check_run_dir(o.logdir, o.resume, run)
        security = ClientSecurity(token=token_from_env(None))  # SecurityError (a ValueError): a bad token
    except (EnvError, ValueError) as e:
        raise LaunchError(str(e)) from None
    problem = bind_problem(o.bind, o.learner_port or 0)
    if problem:
        where = host_port(o.bind, o.learner_port) if o.learner_port else o.bind
        raise LaunchError(
            f"the learner cannot listen on {where}: {problem}; choose another --bind address"
            + (" or --learner-port (or leave it out)." if o.learner_port else ".")
        )
    advertised = _advertised(o)
    try:
        check_writable(os.path.join(o.logdir, "logs"), "the run directory")  # makes RUN/logs
    except StorageError as e:
        raise LaunchError(str(e)) from None
    learner_port = o.learner_port or portpicker.pick_unused_port()
    return LaunchPlan(
        run=run,
        options=o,
        algorithm=algorithm,
        security=security,
        resume_cmd=resume_command(o),
        replay_address=f"{LOOPBACK}:{portpicker.pick_unused_port()}",
        advertised=advertised,
        sources=tuple(
            s._replace(address=f"{LOOPBACK}:{portpicker.pick_unused_port()}") for s in algorithm.replay_sources(run)
        ),
        learner_port=learner_port,
        learner_address=host_port(LOOPBACK if is_wildcard(o.bind) else o.bind, learner_port),
        settings_path=os.path.join(o.logdir, SETTINGS_FILE),
    )


def _advertised(o: UpOptions) -> str | None:
    """The host actors are told for the replay server: --advertise; else --bind where it is one address other
    than loopback; else, for a wildcard --bind, the address this machine's host name resolves to (None for a
    loopback --bind: the replay server's loopback address).

    Raises:
        LaunchError: a wildcard --bind on a machine whose host name resolves to loopback alone, without
            --advertise: actors on other machines could not reach the replay server.
    """
    if o.advertise:
        if o.bind == LOOPBACK:
            raise LaunchError(
                f"--advertise {o.advertise} with the learner on loopback (--bind {LOOPBACK}): no other machine could "
                "reach it; give --bind too (an address of this machine, or 0.0.0.0), or leave --advertise out."
            )
        if ":" in o.advertise.strip("[]") and not o.advertise.startswith("[") and o.advertise.count(":") == 1:
            raise LaunchError(f"--advertise {o.advertise}: give the address alone, without a port.")
        return o.advertise
    if not is_wildcard(o.bind):
        return o.bind if o.bind != LOOPBACK else None
    found = routable_address()
    if found is None:
        raise LaunchError(
            f"--bind {o.bind} listens on every interface, but actors on other machines must be told an address of "
            "this machine to write to its replay server at, and its host name resolves to loopback alone: give "
            "--advertise ADDR (the address of this machine they reach), or --bind that address."
        )
    return found


class _Cluster:
    """The processes of one `launch`: started in order, watched until the learner ends, stopped in reverse."""

    def __init__(self, plan: LaunchPlan, lock: int | None = None):
        self.plan, self.lock = plan, lock  # the run directory's lock, shared with the learner
        self.children: list[_Child] = []
        self.actors: list[_Child] = []
        self.learner: _Child | None = None
        self._pending: list[tuple] = []  # (ready(), what, timeout s, log) of processes started, not yet seen ready
        self._left: list[_Child] = []  # actors stopped by someone else before the run's end

    def _start(self, name: str, args: list[str], lock: int | None = None) -> _Child:
        child = _Child(name, args, self.plan.options.logdir, lock)
        self.children.append(child)
        return child

    def start_replay(self) -> None:
        """Starts the replay server (with checkpoints in RUN/replay when the algorithm keeps its replay) and one
        for each of the algorithm's replay sources (QDagger: its teacher's), serving a read-only copy of that run
        directory's replay in RUN/NAME_replay; `wait_ready` waits until each answers."""
        p, common = self.plan, ["--run-config", self.plan.settings_path]
        logdir = p.options.logdir
        args = ["replay", *common, "--port", p.replay_address.split(":")[1]]
        if p.algorithm.keeps_replay:
            args += ["--checkpoint-dir", os.path.join(logdir, REPLAY_SUBDIR)]
        replay = self._start("replay", args)
        ready = lambda: check_health(replay=p.replay_address, timeout_s=1)[0]
        self._pending.append((ready, "the replay server", REPLAY_READY_S, replay.log_path))
        for source in p.sources:
            copy_dir, port = os.path.join(logdir, f"{source.name}_replay"), source.address.rsplit(":", 1)[1]
            server = self._start(
                f"{source.name}-replay",
                ["replay", *common, "--port", port, "--teacher", source.run_dir, "--checkpoint-dir", copy_dir],
            )
            ready = lambda address=source.address: check_health(replay=address, timeout_s=1)[0]
            self._pending.append((ready, f"the {source.name}'s replay server", REPLAY_READY_S, server.log_path))

    def start_learner(self) -> None:
        """Starts the learner, on the plan's settings and replay server; `wait_ready` waits until it answers."""
        p, o = self.plan, self.plan.options
        args = ["learner", "--run-config", p.settings_path, "--replay", p.replay_address, "--logdir", o.logdir]
        args += ["--total-steps", str(p.run.total_steps), "--port", str(p.learner_port), "--bind", o.bind]
        args += ["--seed", str(p.run.seed), "--env-backend", o.env_backend, "--env-timeout", f"{o.env_timeout_s:g}"]
        args += ["--report-interval", str(o.report_interval)]
        # This process stops the replay servers after the learner: the learner lingers for the actors alone.
        args += ["--linger", "3", "--no-linger-for-replay"]
        args += ["--start-timeout", str(self._learner_start_timeout())]
        if o.video_every:
            args += ["--video-every", str(o.video_every)]
        if p.advertised:  # actors on other machines write to the replay server at this machine's address
            args += ["--replay-for-actors", host_port(p.advertised, p.replay_address.rsplit(":", 1)[1])]
        if o.resume:
            args += ["--resume", o.resume]
        if p.run.teacher:
            args += ["--teacher", p.run.teacher]
        for source in p.sources:
            args += ["--replay-source", f"{source.name}={source.address}"]
        self.learner = self._start("learner", args, self.lock)  # it writes the run directory too
        ready = lambda: check_health(p.learner_address, timeout_s=1)[0]
        self._pending.append((ready, "the learner", LEARNER_READY_S, self.learner.log_path))

    def wait_ready(self) -> None:
        """Waits until every process started so far answers, in the order they were started (their start-ups
        overlap: a learner waits for its replay server by itself), each within its own time limit.

        Raises:
            LaunchError: one exited first, or did not answer in time.
        """
        while self._pending:
            ready, what, timeout, log_path = self._pending.pop(0)
            _wait_until(ready, self.children, what, timeout, log_path)

    def _learner_start_timeout(self) -> float:
        """The learner's --start-timeout: its wait for the replay servers starts with theirs, so it gets their
        time to become ready besides its own."""
        replay_servers = 1 + len(self.plan.sources)
        return START_TIMEOUT_S + replay_servers * REPLAY_READY_S

    def start_actors(self) -> None:
        """Starts the actors. They may start with the learner: each waits for it to serve (and registers then)
        for as long as the learner may take to start (its --start-timeout, then `LEARNER_READY_S`)."""
        p = self.plan
        wait = self._learner_start_timeout() + LEARNER_READY_S
        for i in range(p.options.num_actors):
            args = ["actor", "--learner", p.learner_address, "--connect-timeout", str(wait)]
            self.actors.append(self._start(f"actor-{i}", args))

    def watch(self) -> None:
        """Relays what the children say and prints a progress row every report interval until the learner
        exits.

        Raises:
            LaunchError: an actor or a replay server died, or the learner failed.
        """
        p, learner = self.plan, self.learner
        next_report = time.monotonic() + p.options.report_interval
        phase = "starting"
        while learner.proc.poll() is None:
            self._check_children()
            if time.monotonic() >= next_report:
                next_report = time.monotonic() + p.options.report_interval
                phase = self._report(phase)
            time.sleep(0.2)
        for c in self.children:
            c.relay()
        if learner.proc.returncode != 0:
            raise _fail_child(learner)
        # The run is over: the actors have left (they wait for the run's end, which `up` tells them by this).
        _stop_together(self.actors, 10)

    def _check_children(self) -> None:
        """Relays what the children said since the last call.

        Raises:
            LaunchError: an actor failed, or a replay server exited (the learner's exit `watch` sees itself).
        """
        for c in self.children:
            c.relay()
        for c in self.children:
            code = c.proc.poll()
            if code in (None, 0) or c is self.learner:
                continue
            if c in self.actors and code == EXIT_STOPPED:  # stopped by someone before the run's end: a warning
                if c not in self._left:
                    self._left.append(c)
                    log.warning("%s was stopped before the run's end (exit %d); the run goes on", c.name, code)
                continue
            raise _fail_child(c)
        for c in self.children:
            if "replay" in c.name and c.proc.poll() is not None:
                raise _fail_child(c)

    def _report(self, phase: str) -> str:
        """Prints a progress row from the learner's status; returns the run's phase (`phase`, the last one seen,
        when status did not answer: a learner that is finishing says nothing, one in another phase a warning)."""
        p = self.plan
        try:
            st = get_status(p.learner_address, 5, p.security)
        except StatusError as e:
            try:
                self.learner.proc.wait(2)  # it was just finishing: no message
            except subprocess.TimeoutExpired:
                if phase not in ("evaluating", "done"):
                    log.warning("status unavailable: %s", e)
            return phase
        print(progress_line(st, p.run.total_steps), flush=True)
        return st["phase"]

    def interrupt(self) -> None:
        """Ctrl-C: stops the actors, lets the learner checkpoint, and says how to resume."""
        print("\nrlfleet up: interrupted; stopping actors, checkpointing the learner...", flush=True)
        _stop_together(self.actors, 10)
        if self.learner is not None:
            self.learner.stop(120)
        for c in self.children:
            c.relay()  # what they said while stopping (a checkpoint that failed, say)
        if os.path.exists(os.path.join(self.plan.options.logdir, "checkpoints", "checkpoint")):
            print(f"rlfleet up: stopped. Resume with:\n  {self.plan.resume_cmd}", flush=True)
        else:
            print("rlfleet up: stopped before the learner wrote a checkpoint; nothing to resume.", flush=True)

    def stop(self) -> None:
        """Stops every child still running, the last started first (a replay server that keeps its replay gets
        time to write its checkpoint)."""
        keeps = self.plan.algorithm.keeps_replay
        for c in reversed(self.children):
            c.stop(30 if c.name == "learner" else 300 if c.name == "replay" and keeps else 10)


def _print_summary(logdir: str) -> None:
    summary_path = os.path.join(logdir, "summary.json")
    with open(summary_path) as f:
        summary = json.load(f)
    final = summary["final_eval_return_mean"]
    if summary.get("final_eval_error"):
        final = f"none ({summary['final_eval_error']}; the learner's log has its traceback)"
    elif final is None:
        final = "none (stopped)"
    else:
        final = f"{final:.1f} over {summary['final_eval_episodes']} episode(s)"
    print(
        f"rlfleet up: done. env steps {summary['env_steps']:,}, learner steps {summary['learner_steps']:,}, "
        f"final eval return {final}, {summary['wall_seconds']:.0f}s. Summary: {summary_path}",
        flush=True,
    )


def _print_started(plan: LaunchPlan) -> None:
    """`up`'s lines once every process answers: where the learner is, how actor machines attach, where the logs
    are."""
    o, run = plan.options, plan.run
    address = plan.learner_address
    print(f"rlfleet up: learner at {address} (query it: rlfleet status --learner {address})", flush=True)
    if plan.advertised:
        attach = shlex.join(["rlfleet", "actor", "--learner", host_port(plan.advertised, plan.learner_port)])
        print(f"rlfleet up: actors on other machines attach with: {attach}", flush=True)
    print(
        f"rlfleet up: {o.num_actors} actor(s) x {run.config.envs_per_actor} {run.env_id} envs; logs in "
        f"{os.path.join(o.logdir, 'logs')}",
        flush=True,
    )


def launch(run: RunSettings, options: UpOptions) -> int:
    """Runs the run `run` (its settings, with its seed and budget `total_steps`) as local processes as `options`
    say; returns the process exit code (0 done, 130 interrupted).

    With $RLFLEET_TOKEN set, the learner requires that token and the actors and the progress rows send it. The
    replay server of an algorithm that keeps its replay (`AlgorithmBuilder.keeps_replay`: DQN, QDagger) keeps
    Reverb checkpoints in LOGDIR/replay (so the finished run can be a teacher, and --resume restores its replay);
    an algorithm that reads other runs' replays (`AlgorithmBuilder.replay_sources`; QDagger: its teacher's) gets
    a replay server for each, serving a read-only copy. A run resumed into a run directory whose summary.json says
    it finished its budget starts nothing (returns 0 and says so).

    Raises:
        LaunchError: bad env/teacher (before anything starts), or a child died.
    """
    plan = _plan(run, options)
    logdir = options.logdir
    if options.resume and run_state(logdir, run.total_steps) == "done":  # after the run directory's checks
        print(
            f"rlfleet up: {logdir} finished its budget of {run.total_steps:,} env steps earlier (its summary.json); "
            "nothing to train. Give a larger --total-steps to train it on.",
            flush=True,
        )
        return 0
    try:
        lock = run_lock.hold(logdir, "up")  # one writer per run directory; the learner shares this lock
    except (run_lock.RunDirBusy, OSError) as e:
        raise LaunchError(str(e)) from None
    # Every process reads the same resolved settings (RUN/settings.json), not its own copy of the flags.
    os.makedirs(logdir, exist_ok=True)
    write_json(plan.settings_path, run.to_json())
    cluster = _Cluster(plan, lock)
    # SIGINT too: a shell that starts `up` in the background (`&`) leaves SIGINT ignored, and Ctrl-C or
    # `kill -INT` must still stop the cluster cleanly.
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    try:
        cluster.start_replay()
        cluster.start_learner()
        cluster.start_actors()  # their start-up overlaps the learner's
        cluster.wait_ready()
        _print_started(plan)
        cluster.watch()
        _print_summary(logdir)
        return 0
    except KeyboardInterrupt:
        cluster.interrupt()
        return 130
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        cluster.stop()
