"""Progress lines where people wait: a batched evaluation (a QDagger teacher's) and a read that reports nothing
itself (Reverb restoring a replay checkpoint), with the rate and the time left, as NOTICE lines of the process's
log."""

import logging
import re

import numpy as np

from rlfleet.algorithms.library.evaluation import run_batched_episodes
from rlfleet.common import logs, progress_line
from rlfleet.common.progress_line import ProgressLine, ReadingProgress, duration_words


def test_line_tells_rate_and_time_left():
    line = ProgressLine("offline pretraining", "learner steps")
    line.update(0, 1000)
    text = line.line(250, 1000, now=line.started + 10)
    assert text == "progress: offline pretraining 250/1,000 learner steps (25/s), about 30 s left"
    assert "left" not in line.line(250, None, now=line.started + 10)  # no total known: no time left told
    assert [duration_words(s) for s in (45, 200, 5400, 7800)] == ["45 s", "3 min", "1 h 30 min", "2 h 10 min"]


def _logged(role: str, capsys, monkeypatch):
    """Logs this test's lines to its captured standard error, as the process `role` would."""
    monkeypatch.setattr(progress_line, "INTERVAL_S", 0.0)
    monkeypatch.setattr(logging.getLogger(), "handlers", [])  # the handlers and levels come back after the test
    monkeypatch.setattr(logging.getLogger(), "level", logging.getLogger().level)
    monkeypatch.setattr(logging.getLogger("rlfleet"), "level", logging.getLogger("rlfleet").level)
    logs.configure(role)
    capsys.readouterr()


def _progress_lines(capsys, what: str) -> list[str]:
    lines = [x for x in capsys.readouterr().err.splitlines() if f" NOTICE progress: {what}" in x]
    assert lines, "no progress line"
    assert all(logs.line_level(x) == "NOTICE" for x in lines), lines
    return lines


def test_a_batched_evaluation_reports_its_progress(capsys, monkeypatch):
    _logged("learner", capsys, monkeypatch)
    rng = np.random.default_rng(0)
    episodes = run_batched_episodes(
        "CartPole-v1", 4, 0, lambda obs: rng.integers(0, 2, len(obs)), progress="teacher evaluation"
    )
    lines = _progress_lines(capsys, "teacher evaluation")
    assert all(" learner[" in x for x in lines), lines
    counts = [int(re.search(r"evaluation ([\d,]+)", x).group(1).replace(",", "")) for x in lines]
    assert counts == sorted(counts) and counts[-1] < sum(episodes.lengths)
    assert "episodes ended" in lines[-1]
    # Once an episode has ended, the env steps of all of them are estimated (never below those taken), and the
    # time left with them.
    estimated = [x for x in lines if not x.endswith(" 0/4 episodes ended")]
    assert estimated and all("left" in x for x in estimated), estimated
    for x in estimated:
        done, total = (int(v.replace(",", "")) for v in re.search(r"evaluation ([\d,]+)/([\d,]+)", x).groups())
        assert done < total


def test_reading_progress_counts_the_bytes_read(tmp_path, capsys, monkeypatch):
    _logged("replay", capsys, monkeypatch)
    data = tmp_path / "checkpoint.data"
    data.write_bytes(np.random.default_rng(0).bytes(8_000_000))
    with ReadingProgress("restoring the replay", 8_000_000):
        for _ in range(6):  # a slow reader: 8 MB over about 3 s, read as a restore reads its files
            with open(data, "rb") as f:
                while f.read(1_000_000):
                    import time

                    time.sleep(0.06)
    lines = _progress_lines(capsys, "restoring the replay")
    assert re.search(r"restoring the replay [\d,]+/8 MB", lines[-1]), lines[-1]
