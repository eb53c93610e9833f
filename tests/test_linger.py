"""The finished learner's linger (learner/service.py `Learner._linger`): without `linger_for_replay` it ends as soon
as no actor is registered, and at its deadline otherwise, saying which actors were still there."""

import logging
import threading
import time
import types

import pytest

from rlfleet.learner.service import Learner


def _learner(actors: dict, linger_for_replay: bool):
    """The parts of a `Learner` that its linger reads: the stop event, the lock, the actor registry, the replay
    feed's last answer and the run's settings."""
    return types.SimpleNamespace(
        stop_event=threading.Event(),
        lock=threading.Lock(),
        registry=types.SimpleNamespace(actors=actors),
        feed=types.SimpleNamespace(last_answer=None),
        run_spec=types.SimpleNamespace(linger_for_replay=linger_for_replay),
    )


@pytest.fixture
def said(caplog):
    """What the learner's log says (its INFO lines included)."""
    caplog.set_level(logging.INFO, logger="rlfleet")
    return lambda: caplog.text


def _linger(learner, seconds):
    start = time.monotonic()
    Learner._linger(learner, seconds)
    return time.monotonic() - start


def test_without_the_replay_it_ends_once_no_actor_is_registered(said):
    assert _linger(_learner({}, linger_for_replay=False), 30.0) < 10.0
    assert "no actor is registered; exiting" in said()


def test_an_actor_that_never_leaves_holds_it_to_the_deadline_and_is_named(said):
    learner = _learner({7: object()}, linger_for_replay=False)
    assert _linger(learner, 2.0) >= 2.0
    assert "actors [7] still registered" in said()
    # Once the actor leaves, the linger ends early.
    threading.Timer(0.5, learner.registry.actors.clear).start()
    assert _linger(learner, 30.0) < 10.0


def test_with_the_replay_it_waits_for_the_replay_server_to_stop(said):
    # No actor, but the replay server never answered at the end: nothing says it stopped, so the deadline holds.
    assert _linger(_learner({}, linger_for_replay=True), 2.0) >= 2.0
    assert "no actor is registered" not in said()
