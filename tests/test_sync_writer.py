"""The PPO writer's items (a `rlfleet.actors.adders.SequenceAdder` as PPO sets it up) with several actors at once: under
synchronous collection each item's steps are of one policy version, each actor writes its share and waits, and
the learner's batches keep filling (no stall) whatever the actors' timing; asynchronously, the actors run ahead
of the learner no further than the policy-lag limit (`ItemCredit`). The actors are threads running the
real writer, weights subscriber (fed in-process) and learner agent; only the replay server and the envs are
stand-ins (the real ones run in tests/test_synchronous.py)."""

import queue
import threading
import time
import types

import numpy as np
import pytest

from rlfleet import algorithms
from rlfleet.actors import adders, writers
from rlfleet.actors.actor import Policy, ReplayLost, _WeightsSubscriber
from rlfleet.algorithms.base import CreditLimit
from rlfleet.algorithms.ppo.agent import PPOAgent
from rlfleet.algorithms.ppo.config import make_config
from rlfleet.envs.core import env_spec
from rlfleet.proto import rlfleet_pb2

SPEC = env_spec("Pendulum-v1")
PPO = algorithms.get("ppo")
ITEMS: queue.Queue = queue.Queue()


class _Writer:
    def __init__(self, keep):
        self.keep, self.history = keep, {}

    def append(self, step):
        for k, v in step.items():
            self.history.setdefault(k, []).append(np.asarray(v))
            del self.history[k][: -self.keep]

    def create_item(self, table, priority, trajectory):
        ITEMS.put({k: np.stack(v) for k, v in trajectory.items()})

    def close(self):
        pass


class _Client:
    def __init__(self, address):
        pass

    def trajectory_writer(self, num_keep_alive_refs):
        return _Writer(num_keep_alive_refs)


class _Envs:
    """Pendulum-shaped batch whose steps take `seconds` (actors of different speeds)."""

    def __init__(self, b, seconds, seed):
        self.b, self.seconds, self.rng = b, seconds, np.random.default_rng(seed)

    def step(self, action):
        time.sleep(self.seconds)
        done = self.rng.random(self.b) < 0.02
        obs = self.rng.standard_normal((self.b, 3))
        return obs, self.rng.standard_normal(self.b), done, np.zeros(self.b, bool), {}


class _Actor:
    def __init__(self, config, stop, seed):
        self.config = types.SimpleNamespace(unroll_length=config.unroll_length, num_envs=config.envs_per_actor)
        self.config.table = "ppo"
        self.net = types.SimpleNamespace(discount=0.99, action_low=[-2.0], action_high=[2.0])
        self.replay_address, self.stop, self.policy_version, self.seed = "stand-in", stop, -1, seed
        self.replay_epoch = 0

    def start_episodes(self, venv):
        return np.random.default_rng(self.seed), np.zeros((venv.b, 3))

    def check_policy_output(self, *values):
        pass

    def check_finite(self, *values):
        pass

    def check_replay(self, epoch):
        if self.replay_epoch != epoch:
            raise ReplayLost()

    def wait_written(self, writer, epoch, in_flight=1):
        return True

    def count_steps(self, reward, done):
        pass


@pytest.mark.parametrize("num_actors,stagger", [(1, 0.0), (2, 0.0), (3, 0.0), (2, 0.3)])
def test_synchronous_actors_write_single_version_items_and_the_batches_fill(monkeypatch, num_actors, stagger):
    monkeypatch.setattr(adders, "Client", _Client)
    while not ITEMS.empty():
        ITEMS.get()
    settings = {"synchronous": True, "envs_per_actor": 2, "unroll_length": 16, "batch_env_steps": 128, "epochs": 1}
    config = make_config("default", "Pendulum-v1", settings)
    agent = PPOAgent(SPEC, config, 0)
    stop = threading.Event()
    subscribers = [_WeightsSubscriber(None, i, stop) for i in range(num_actors)]

    def publish(version, actors):
        share = agent.items_per_actor(actors)
        for s in subscribers:
            s.receive(Policy(version, agent.export_weights(), rlfleet_pb2.Exploration()), share)

    publish(0, 0)  # as the learner does: before any actor has registered
    threads = []
    for i, s in enumerate(subscribers):
        actor = _Actor(config, stop, i)
        venv = _Envs(config.envs_per_actor, 0.0005 * (i + 1), i)
        threads.append(threading.Thread(target=adders.collect, args=(PPO, actor, venv, s, 0), daemon=True))
        threads[-1].start()
        time.sleep(stagger)
    version, dropped, consumed = 0, 0, 0
    try:
        deadline = time.monotonic() + 60
        while version < 6:
            assert time.monotonic() < deadline, f"stalled at policy version {version} ({num_actors} actors)"
            try:
                item = ITEMS.get(timeout=5)
            except queue.Empty:
                raise AssertionError(f"no item for 5 s at policy version {version}: the actors all wait") from None
            trained = item["policy_version"][:-1]
            if np.all(trained == version):
                consumed += trained.size
            result = agent.consume(item, version, 0)
            assert len(np.unique(trained)) == 1, "an item mixes the steps of two policy versions"
            dropped += result.dropped
            if result.updated:
                assert result.metrics["off_policy_fraction"] == 0.0
                assert result.metrics["max_importance_weight"] == pytest.approx(1.0, abs=1e-4)
                version += 1
                publish(version, num_actors)
    finally:
        stop.set()
        for th in threads:
            th.join(timeout=10)
    assert consumed >= 6 * 128
    # What is dropped is the over-collection of the shares alone: the first version's, made before the actors
    # registered (each writes the whole batch), and the rounding up of each later share.
    items, per_item = 4, 2 * 16
    share = -(-items // num_actors)
    assert dropped <= ((num_actors - 1) * items + (version + 1) * (num_actors * share - items)) * per_item, dropped


def test_item_credit_refills_by_share_per_version_up_to_the_window():
    credit = writers.ItemCredit()
    credit.see(5, CreditLimit(0.0, 0))
    for _ in range(3):  # no limit
        assert credit.available()
        credit.take()
    credit.see(5, CreditLimit(1.5, 1))  # a window of 3 items
    for _ in range(3):
        assert credit.available()
        credit.take()
    assert not credit.available()
    credit.see(5, CreditLimit(1.5, 1))  # the same version again: nothing new
    assert not credit.available()
    credit.see(6, CreditLimit(1.5, 1))
    assert credit.items == 1.5 and credit.available()
    credit.see(9, CreditLimit(1.5, 1))  # versions skipped: refilled up to the window, not beyond
    assert credit.items == 3.0
    credit.see(10, CreditLimit(0.5, 1))  # a smaller share (more actors): the window shrinks to 1
    assert credit.items == 1.0
    credit.take()
    credit.see(10, CreditLimit(0.5, 1), resends=1)  # a restarted learner sent its version again: a full window
    assert credit.items == 1.0 and credit.available()
    credit.take()
    credit.see(11, CreditLimit(0.25, 3), resends=1)  # a share under one item per version: one item every 4 versions
    assert credit.items == 0.25 and not credit.available()


def test_a_learner_that_sends_the_same_version_again_ends_the_wait():
    subscriber = _WeightsSubscriber(None, 0, threading.Event())
    subscriber.receive(Policy(3, {}, rlfleet_pb2.Exploration()), 2)
    serial, stop = subscriber.serial, threading.Event()
    threading.Timer(0.2, lambda: subscriber.receive(Policy(3, {}, rlfleet_pb2.Exploration()), 2)).start()
    started = time.monotonic()
    assert subscriber.wait_next(serial, stop)  # a restarted learner re-sends its checkpoint's version
    assert subscriber.resends == 1
    assert 0.1 < time.monotonic() - started < 5
    epoch = {"now": 0}

    def check():
        if epoch["now"]:
            raise ReplayLost()

    threading.Timer(0.2, lambda: epoch.update(now=1)).start()
    with pytest.raises(ReplayLost):
        subscriber.wait_next(subscriber.serial, stop, check)
    threading.Timer(0.2, stop.set).start()
    assert not subscriber.wait_next(subscriber.serial, stop)


@pytest.mark.parametrize(
    "num_actors,unroll_length,credit", [(1, 64, True), (1, 16, True), (3, 16, True), (1, 64, False)]
)
def test_asynchronous_actors_run_ahead_no_further_than_the_lag_limit(monkeypatch, num_actors, unroll_length, credit):
    """Actors much faster than the learner: with the credit, they run ahead (consumed data is off-policy) but
    no item reaches the learner older than `max_policy_lag`, so none is dropped; without it, items one batch
    long are dropped (the fault the credit removes)."""
    monkeypatch.setattr(adders, "Client", _Client)
    while not ITEMS.empty():
        ITEMS.get()
    settings = {"envs_per_actor": 2, "unroll_length": unroll_length, "batch_env_steps": 128, "epochs": 1}
    config = make_config("default", "Pendulum-v1", dict(settings, actor_credit=credit))
    agent = PPOAgent(SPEC, config, 0)
    stop = threading.Event()
    subscribers = [_WeightsSubscriber(None, i, stop) for i in range(num_actors)]

    def publish(version):
        limit = agent.item_credit(num_actors)
        assert (limit.item_share > 0) == credit
        for s in subscribers:
            s.receive(Policy(version, agent.export_weights(), rlfleet_pb2.Exploration()), 0, limit)

    publish(0)
    threads = []
    for i, s in enumerate(subscribers):
        actor = _Actor(config, stop, i)
        venv = _Envs(config.envs_per_actor, 0.0002 * (i + 1), i)
        threads.append(threading.Thread(target=adders.collect, args=(PPO, actor, venv, s, 0), daemon=True))
        threads[-1].start()
    version, dropped, lags = 0, 0, []
    try:
        deadline = time.monotonic() + 60
        while version < 12:
            assert time.monotonic() < deadline, f"stalled at policy version {version} ({num_actors} actors)"
            try:
                item = ITEMS.get(timeout=5)
            except queue.Empty:
                raise AssertionError(f"no item for 5 s at policy version {version}: the actors all wait") from None
            result = agent.consume(item, version, 0)
            dropped += result.dropped
            if result.updated:
                lags.append(result.metrics["policy_lag_max"])
                time.sleep(0.15)  # the learner's update: far slower than the actors' items
                version += 1
                publish(version)
    finally:
        stop.set()
        for th in threads:
            th.join(timeout=10)
    if credit:
        assert dropped == 0, (dropped, lags)
        assert max(lags) >= 1, lags  # asynchronous: the actors did run ahead of the learner
        assert max(lags) <= config.max_policy_lag, lags
    else:
        assert dropped > 0, lags
