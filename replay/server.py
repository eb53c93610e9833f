"""The Reverb replay server process: the run's tables (each algorithm defines its own, with their signatures:
`AlgorithmBuilder.make_tables`), serving, checkpoints on a schedule and at the end, and table status."""

from __future__ import annotations

import errno
import logging
import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable

import reverb
import tensorflow as tf

from rlfleet.common.files import StorageError, check_writable, disk_space, tree_bytes
from rlfleet.common.logs import NOTICE, logger
from rlfleet.common.parent import pid_alive
from rlfleet.common.progress_line import ReadingProgress
from rlfleet.common.stopping import on_stop_signals
from rlfleet.replay import checkpoints

RUN_OVER_POLL_S = 2.0  # seconds between asks of `serve`'s run_over

log = logger("replay")


def tables_for(algo: str, spec, config, queue_items: int | None = None) -> list:
    """Replay tables of the registered algorithm `algo` for an env spec and its config
    (`AlgorithmBuilder.make_tables`).

    Raises:
        UnknownAlgorithmError (a ValueError): no such algorithm; ValueError: bad sizes.
    """
    from rlfleet import algorithms

    return algorithms.get(algo).make_tables(spec, config, queue_items)


def serve(
    tables: list,
    port: int,
    stop_event: threading.Event | None = None,
    checkpoint_dir: str | None = None,
    source_dir: str | None = None,
    checkpoint_interval_s: float = 0.0,
    run_over: Callable[[], str | None] | None = None,
) -> None:
    """Runs a Reverb server on `port` (all interfaces; 0: a free one, logged) until SIGTERM/SIGINT, `stop_event`,
    or `run_over`.

    With `checkpoint_dir` the tables start from the latest Reverb checkpoint
    there (if any), a new checkpoint is written every `checkpoint_interval_s`
    seconds (0: never) and when stopping, each time only if the tables changed
    since the latest one: a server killed without warning restarts from what
    it held at most one interval earlier. With `source_dir` (another run's
    directory, whose replay an algorithm reads as a replay source: QDagger's teacher) the server instead serves
    that run's replay read-only, from a copy made in `checkpoint_dir` whose rate limiter admits every sample
    (`rlfleet.replay.checkpoints.open_teacher_replay`); `tables` then only name the tables to expect. Without
    either, a checkpoint asked of the server goes to a temporary folder, which the server removes when it stops if
    none was asked for. Reverb binds every interface and has no authentication:
    keep its port on a private network (see README). `run_over`, when given, is asked every
    `RUN_OVER_POLL_S` seconds; once it returns a reason (a string) the server stops as on SIGTERM (a cluster
    under docker-compose ends when its learner's run does).

    Raises:
        ValueError: port in use; ReplayCheckpointError (a ValueError): no usable teacher replay;
        rlfleet.common.files.StorageError: the checkpoint folder cannot be written.
    """
    chosen_port = port
    ckpt, restoring, restore_from = _checkpointer(checkpoint_dir, source_dir)
    requested = {t.name: t.info for t in tables}
    scratch = None
    if ckpt is None:  # Reverb would make a temporary folder of its own and leave it behind
        ckpt, scratch = _scratch_checkpointer()
    server = _start_server(tables, port, ckpt, scratch, restore_from)
    port = server.port
    if restoring:
        _check_restored(server, requested, restoring)
    stop = stop_event or threading.Event()
    on_stop_signals(stop.set)
    # A port Reverb picked (--port 0) is told only here: a notice, so that it is shown at every level but warning.
    names = ", ".join(t.name for t in tables)
    log.log(NOTICE if chosen_port == 0 else logging.INFO, "serving on port %d (tables %s)", port, names)
    writes = checkpoint_dir if checkpoint_dir and not source_dir else None
    _serve_until_stopped(port, stop, writes, restoring, checkpoint_interval_s, run_over)
    saved = _checkpoint_if_changed(port, writes, restoring, final=True) if writes else True
    server.stop()
    if not saved:
        raise StorageError(
            errno.EIO,
            f"the last replay checkpoint could not be written to {checkpoint_dir}; the newest one there, "
            f"{checkpoints.latest_checkpoint(checkpoint_dir)}, is what a restart restores.",
        )
    if scratch and not _remove_if_empty(scratch):
        log.log(NOTICE, "checkpoints asked of this server (started without --checkpoint-dir) are in %s", scratch)
    log.info("stopped")


def _scratch_checkpointer():
    """(checkpointer, folder): a Reverb checkpointer into a new temporary folder of this process (those that
    processes gone left empty are removed first)."""
    _sweep_scratch()
    scratch = tempfile.mkdtemp(prefix=f"{_SCRATCH_PREFIX}{os.getpid()}-")
    return checkpoints.checkpointer(scratch), scratch


def _checkpointer(checkpoint_dir: str | None, source_dir: str | None):
    """The Reverb checkpointer `serve` starts with, the run's own checkpoint it restores (None: empty tables, or a
    teacher's), and the folder Reverb restores from (None: nothing): the teacher's replay copied into
    `checkpoint_dir`, or the newest readable checkpoint there (damaged ones moved aside), or (None, None, None)
    without a checkpoint folder."""
    if source_dir:
        if not checkpoint_dir:
            raise ValueError("serving a teacher's replay needs --checkpoint-dir (where its read-only copy goes).")
        check_writable(checkpoint_dir, "the copy of the teacher's replay")
        copy = checkpoints.open_teacher_replay(os.path.join(source_dir, checkpoints.REPLAY_SUBDIR), checkpoint_dir)
        return checkpoints.checkpointer(checkpoint_dir, restore_from=copy), None, copy
    if not checkpoint_dir:
        return None, None, None
    check_writable(checkpoint_dir, "replay checkpoints")  # StorageError: read-only, no permission, full
    # Finished checkpoints a stopped server left in the staging folder count; unfinished ones are debris.
    # Nothing is removed before the checkpoint to restore is known to read.
    checkpoints.discard_unfinished(checkpoint_dir)
    checkpoints.promote(checkpoint_dir, then_prune=False)  # nothing goes before it is known which one reads
    restoring, skipped, damaged = checkpoints.usable_checkpoint(checkpoint_dir)
    for line in skipped:
        log.warning("skipped a damaged replay checkpoint: %s", line)
    for path in checkpoints.quarantine(damaged):
        log.warning("moved the damaged checkpoint aside: %s", path)
    if restoring:
        log.log(NOTICE, "restoring %s", restoring)
    elif skipped:
        log.warning("no replay checkpoint could be read; the tables start empty")
    checkpoints.prune(checkpoint_dir, protect=restoring)  # the newest KEEP, and the restored one
    return checkpoints.checkpointer(checkpoint_dir, restore_from=restoring), restoring, restoring


def _start_server(tables: list, port: int, ckpt, scratch: str | None, restore_from: str | None) -> reverb.Server:
    """A Reverb server on `port` (0: a free one), with progress lines while it restores `restore_from` (Reverb
    reads the whole checkpoint before it serves, and says nothing meanwhile).

    Raises:
        ValueError: the port is in use (the scratch checkpoint folder, if empty, is removed).
    """
    try:
        if port:
            _check_port_free(port)
        if restore_from:
            with ReadingProgress("restoring the replay", tree_bytes([restore_from])):
                return reverb.Server(tables=tables, port=port or None, checkpointer=ckpt)
        # Port 0: Reverb picks a free one when given None (given 0 it binds one but reports 0).
        return reverb.Server(tables=tables, port=port or None, checkpointer=ckpt)
    except ValueError as e:
        _remove_if_empty(scratch)
        raise ValueError(
            f"cannot start the replay server on port {port} (port in use?): {e}; choose another --port."
        ) from None


def _check_restored(server: reverb.Server, requested: dict, restoring: str) -> None:
    """Reverb replaces the tables asked for with the checkpoint's: they must be the same.

    Raises:
        ValueError: they differ (the server is stopped, nothing was served).
    """
    restored = reverb.Client(f"localhost:{server.port}").server_info()
    differences = checkpoints.restored_differences(requested, restored)
    if differences:
        server.stop()
        raise ValueError(
            f"the replay checkpoint {restoring} was written with other settings than this server was started "
            f"with, or by a version of rlfleet whose replay items were laid out differently: "
            f"{'; '.join(differences)}. Start it with the settings of the run that wrote the checkpoint "
            "(its run directory's settings.json: --run-config) and the same rlfleet version, or give another "
            "--checkpoint-dir to start with empty tables; nothing was served."
        )


def _serve_until_stopped(port, stop, checkpoint_dir, restoring, checkpoint_interval_s, run_over) -> None:
    """Waits for `stop` or `run_over`, moving the checkpoints clients asked for into place and writing one every
    `checkpoint_interval_s` seconds when the tables changed (with `checkpoint_dir`)."""
    next_checkpoint = time.monotonic() + checkpoint_interval_s
    next_poll = time.monotonic() + RUN_OVER_POLL_S
    while not stop.wait(0.5):
        if run_over is not None and time.monotonic() >= next_poll:
            reason = run_over()
            if reason:
                log.info("%s; stopping", reason)
                return
            next_poll = time.monotonic() + RUN_OVER_POLL_S
        if not checkpoint_dir:
            continue
        try:
            checkpoints.promote(checkpoint_dir, protect=restoring)  # those clients asked for (`checkpoint_replay`)
        except StorageError as e:
            log.error("%s", e)
        if checkpoint_interval_s > 0 and time.monotonic() >= next_checkpoint:
            _checkpoint_if_changed(port, checkpoint_dir, restoring)
            next_checkpoint = time.monotonic() + checkpoint_interval_s


def _checkpoint_if_changed(port: int, checkpoint_dir: str, restoring: str | None, final: bool = False) -> bool:
    """Writes a checkpoint if the tables changed since the latest; False when it could not be written (a full
    disk, say: the tables stay served, and the checkpoints before stay as they were)."""
    client = reverb.Client(f"localhost:{port}")
    try:
        checkpoints.promote(checkpoint_dir, protect=restoring)  # Reverb keeps only its newest name: empty it
        latest = checkpoints.latest_checkpoint(checkpoint_dir)
        if checkpoints.tables_changed(client, latest):
            client.checkpoint()
            checkpoints.promote(checkpoint_dir, protect=restoring)
            log.info("checkpoint %s", checkpoints.latest_checkpoint(checkpoint_dir))
        elif final and latest:
            log.info("tables unchanged since checkpoint %s", latest)
        elif final:
            log.info("tables empty, no checkpoint written")
        return True
    except (StorageError, RuntimeError, ValueError, reverb.errors.ReverbError, tf.errors.OpError) as e:
        space = ""
        if getattr(e, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or "No space left" in str(e):
            try:
                last = checkpoints.latest_checkpoint(checkpoint_dir)
                space = f" ({disk_space(checkpoint_dir, tree_bytes([last]) if last else None)})"
            except OSError:
                pass
        log.error("the replay checkpoint failed: %s%s", e, space)
        return False


_SCRATCH_PREFIX = "rlfleet-replay-"  # + the server's pid: its checkpoint folder when started without --checkpoint-dir


def _sweep_scratch() -> None:
    """Removes the empty scratch folders of replay servers that were killed (SIGKILL, OOM) before they could:
    folders in the temporary directory named by `_SCRATCH_PREFIX` and a pid that no process has now. A folder
    with anything in it (a checkpoint someone asked for) is kept."""
    root = tempfile.gettempdir()
    for name in os.listdir(root):
        pid = name.removeprefix(_SCRATCH_PREFIX).split("-", 1)[0]
        if not name.startswith(_SCRATCH_PREFIX) or not pid.isdigit():
            continue
        if not pid_alive(int(pid)):  # else that server (or another user's process of that pid) still runs
            _remove_if_empty(os.path.join(root, name))


def _remove_if_empty(path: str | None) -> bool:
    """Removes the folder `path` if nothing was written into it; True when it is gone (or None)."""
    if path is None:
        return True
    try:
        if os.path.isdir(os.path.join(path, checkpoints.STAGING)):
            os.rmdir(os.path.join(path, checkpoints.STAGING))
        os.rmdir(path)
        return True
    except OSError:
        return False


def _check_port_free(port: int) -> None:
    """Raises ValueError when any process listens on `port`. Reverb's gRPC server sets SO_REUSEPORT, so a
    second server on a held port would start and split the clients between the two; a probe socket
    without SO_REUSEPORT cannot bind such a port (IPv4 and, where the host has it, IPv6)."""
    for family, host in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            probe = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 on this host
        with probe:
            # SO_REUSEADDR: connections of a server that just stopped (TIME_WAIT) do not hold the port; a
            # listening socket does.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
            except OSError as e:
                if e.errno == errno.EADDRNOTAVAIL:
                    continue
                raise ValueError(f"port {port} is held by another process ({e.strerror})") from None


def table_status(address: str, timeout_s: int = 2) -> list[dict]:
    """Reads size, max size and insert/sample counts of every table at `address`.

    Returns an empty list when the server cannot be reached within `timeout_s`.
    """
    try:
        info = reverb.Client(address).server_info(timeout=timeout_s)
    except Exception:  # unreachable replay must not break status
        return []
    return [
        {
            "table": name,
            "size": int(t.current_size),
            "max_size": int(t.max_size),
            "inserts": int(t.rate_limiter_info.insert_stats.completed),
            "samples": int(t.rate_limiter_info.sample_stats.completed),
        }
        for name, t in sorted(info.items())
    ]
