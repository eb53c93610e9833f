"""One log channel per process: each line names the time, the role and pid, and its level; `--log-level` and
$RLFLEET_LOG_LEVEL choose the least level; no service module prints past it."""

import ast
import io
import logging
import os
import re
import subprocess
import sys

import pytest
from helpers import ROOT, wait_for

from rlfleet.common import logs

LINE = re.compile(
    r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (?P<role>[\w-]+)\[(?P<pid>\d+)\] (?P<level>[A-Z]+) (?P<msg>.*)$"
)
# The folders whose modules run inside the services: they speak through the log alone.
SERVICE_FOLDERS = ("common", "envs", "algorithms", "actors", "learner", "replay")


@pytest.fixture
def restore_logging(monkeypatch):
    """The root handlers and the levels come back after the test."""
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    monkeypatch.setattr(logging.getLogger(), "level", logging.getLogger().level)
    monkeypatch.setattr(logging.getLogger("rlfleet"), "level", logging.getLogger("rlfleet").level)
    yield
    logs.set_role("rlfleet")


def test_a_line_names_time_role_pid_and_level_and_the_level_filters(restore_logging):
    out = io.StringIO()
    logs.configure("learner", "notice", out)
    log = logs.logger("learner")
    log.info("not shown at notice")
    log.log(logs.NOTICE, "resumed from %s", "ckpt-4")
    logs.set_role("actor-3")
    log.warning("learner %s is back", "h:1")
    logging.getLogger("tensorflow").info("another library's info: not shown")
    logging.getLogger("tensorflow").warning("another library's warning")
    lines = out.getvalue().splitlines()
    assert len(lines) == 3, lines
    parsed = [LINE.match(x) for x in lines]
    assert all(parsed), lines
    assert [(m["role"], int(m["pid"]), m["level"]) for m in parsed] == [
        ("learner", os.getpid(), "NOTICE"),
        ("actor-3", os.getpid(), "WARNING"),
        ("actor-3", os.getpid(), "WARNING"),
    ]
    assert parsed[0]["msg"] == "resumed from ckpt-4" and parsed[1]["msg"] == "learner h:1 is back"
    assert parsed[2]["msg"] == "[tensorflow] another library's warning"
    # What `up` relays: rlfleet's lines at NOTICE and above, never another library's.
    assert [logs.line_level(x) for x in lines] == ["NOTICE", "WARNING", None]
    # Nor a library's own output, nor a progress row.
    assert logs.line_level("[reverb/cc/platform/default/server.cc:71] Started replay server on port 1") is None
    assert logs.line_level("[    5.3s] training   env steps      1,576/3,000 (315/s)") is None
    with pytest.raises(ValueError, match="use one of debug, info, notice, warning, error"):
        logs.configure("learner", "verbose", out)


@pytest.mark.slow
def test_a_service_logs_at_the_level_asked_for(tmp_path):
    """A real replay server: at the default level its start and stop are INFO lines on standard error with its pid;
    with --log-level warning (or $RLFLEET_LOG_LEVEL) they are not written; standard output stays empty."""
    for name, args, env in (
        ("default", [], None),
        ("flag", ["--log-level", "warning"], None),
        ("environment", [], dict(os.environ, RLFLEET_LOG_LEVEL="warning")),
    ):
        out, err = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
        with open(out, "w") as o, open(err, "w") as e:
            proc = subprocess.Popen(
                [sys.executable, "-m", "rlfleet.deploy.cli", "replay", "--algo", "dqn", "--env", "CartPole-v1"]
                + ["--port", "0", *args],
                cwd=ROOT,
                env=env,
                stdout=o,
                stderr=e,
                start_new_session=True,
            )
        try:
            wait_for(lambda p=proc: _listening(p.pid), 120, f"the {name} replay server to listen", [])
        finally:
            proc.terminate()
            proc.wait(60)
        assert proc.returncode == 0, err.read_text()[-3000:]
        assert out.read_text() == ""
        lines = [m for m in map(LINE.match, err.read_text().splitlines()) if m]
        if name == "default":
            assert {(m["role"], int(m["pid"])) for m in lines} == {("replay", proc.pid)}, err.read_text()
            messages = [(m["level"], m["msg"]) for m in lines]
            assert messages[-1] == ("INFO", "stopped"), messages
            # The port Reverb picked (--port 0) is told only there: a notice, shown at every level but warning.
            assert any(level == "NOTICE" and msg.startswith("serving on port ") for level, msg in messages), messages
        else:
            assert [m.group(0) for m in lines if m["level"] in ("DEBUG", "INFO", "NOTICE")] == [], name


def _listening(pid: int) -> bool:
    import psutil

    try:
        return any(c.status == psutil.CONN_LISTEN for c in psutil.Process(pid).net_connections())
    except psutil.Error:
        return False


def test_a_bad_log_level_is_refused_with_the_choices():
    out = subprocess.run(
        [sys.executable, "-m", "rlfleet.deploy.cli", "status", "--learner", "127.0.0.1:1"],
        cwd=ROOT,
        env=dict(os.environ, RLFLEET_LOG_LEVEL="loud"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    assert "RLFLEET_LOG_LEVEL='loud': use one of debug, info, notice, warning, error" in out.stderr, out.stderr


def test_no_service_module_prints():
    """The modules that run in the services write through their logger: `print` and `click.echo` are for a
    command's own result (deploy/)."""
    found = []
    for folder in SERVICE_FOLDERS:
        for dirpath, _, filenames in os.walk(os.path.join(ROOT, folder)):
            for name in filenames:
                if not name.endswith(".py") or name.endswith("_pb2.py") or name.endswith("_pb2_grpc.py"):
                    continue
                path = os.path.join(dirpath, name)
                with open(path) as f:
                    tree = ast.parse(f.read(), path)
                for node in ast.walk(tree):
                    if isinstance(node, ast.Call):
                        name_of = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                        if name_of in ("print", "echo", "secho"):
                            found.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}")
    assert found == []
