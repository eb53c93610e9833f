"""A connection that dies without a FIN or RST (a NAT or firewall that dropped its state, a frozen host): the actor
notices and connects anew. To the learner, by its heartbeats going unanswered (gRPC's keepalive pings are not sent
while its calls keep writing); to the replay server, by its items going unconfirmed while the server says the
table takes inserts. Real processes; the actor reaches the learner or the replay server through a loopback relay
that, when frozen, stops forwarding on its open connections without closing them."""

import select
import socket
import threading
import time

import pytest
from helpers import start_replay_and_learner, status_or_none, wait_for

pytestmark = pytest.mark.slow

SETTINGS = ("--algo", "ppo", "--env", "Pendulum-v1", "--set", "eval_every_updates=1000", "--set", "eval_episodes=1")


class FreezableRelay:
    """Forwards each TCP connection to 127.0.0.1:`target_port` from a loopback port of its own (`port`).
    `freeze()` stops forwarding on every connection open then, keeping both sockets open; later connections are
    forwarded."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections: list[dict] = []
        self.closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closed.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            conn = dict(sockets=(client, upstream), frozen=threading.Event(), bytes=0)
            self.connections.append(conn)
            threading.Thread(target=self._pump, args=(client, upstream, conn), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, conn), daemon=True).start()

    def _pump(self, src, dst, conn):
        while not self.closed.is_set():
            if conn["frozen"].is_set():  # silent: nothing read, nothing written, nothing closed
                time.sleep(0.1)
                continue
            readable, _, _ = select.select([src], [], [], 0.1)
            if not readable:
                continue
            try:
                data = src.recv(65536)
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                dst.sendall(data)
                conn["bytes"] += len(data)
            except OSError:
                return

    def freeze(self) -> int:
        """Freezes every open connection; returns how many."""
        open_now = list(self.connections)
        for conn in open_now:
            conn["frozen"].set()
        return len(open_now)

    def close(self):
        self.closed.set()
        self.listener.close()
        for conn in self.connections:
            for s in conn["sockets"]:
                s.close()


def _actor(st):
    return st["actors"][0] if st and len(st["actors"]) == 1 else None


def test_an_actor_whose_connection_died_silently_reconnects(procs, tmp_path, free_port):
    replay, learner, address = start_replay_and_learner(
        procs, free_port, SETTINGS, tmp_path / "run", "--actor-timeout", "120"
    )
    wait_for(lambda: status_or_none(address), 180, "the learner to serve", [replay, learner])
    relay = FreezableRelay(int(address.rsplit(":", 1)[1]))
    try:
        actor = procs.start("actor", "actor", "--learner", f"127.0.0.1:{relay.port}")
        every = [replay, learner, actor]
        wait_for(lambda: (a := _actor(status_or_none(address))) and a["policy_version"] >= 2, 180, "training", every)
        assert relay.freeze() >= 1
        frozen_at = time.monotonic()
        before = status_or_none(address)
        # Heartbeats (every second) stop reaching the learner through the frozen connection...
        wait_for(
            lambda: (a := _actor(status_or_none(address))) and a["seconds_since_heartbeat"] > 3,
            30,
            "the frozen connection to stop the heartbeats",
            every,
        )

        def recovered():
            st = status_or_none(address)
            a = _actor(st)
            return (
                a
                and a["seconds_since_heartbeat"] < 2
                and a["policy_version"] > before["policy_version"]  # the weight stream is back too
                and a["env_steps"] > _actor(before)["env_steps"]
            )

        # ... until two of them went unanswered (5 s each) and the actor connects anew.
        wait_for(recovered, 45, "the actor to reconnect through a new connection", every)
        assert time.monotonic() - frozen_at < 45
        assert len(relay.connections) > 1
        assert "heartbeats in a row got no reply; connecting to the learner" in actor.output(), actor.output()
        assert "too_many_pings" not in learner.output() + actor.output()
    finally:
        relay.close()


def test_an_actor_whose_replay_connection_died_silently_writes_on_a_new_one(procs, tmp_path, free_port):
    replay, learner, address = start_replay_and_learner(procs, free_port, SETTINGS, tmp_path / "run")
    wait_for(lambda: status_or_none(address), 180, "the learner to serve", [replay, learner])
    relay = FreezableRelay(replay.port)
    try:
        actor = procs.start("actor", "actor", "--learner", address, "--replay", f"127.0.0.1:{relay.port}")
        every = [replay, learner, actor]
        wait_for(lambda: (a := _actor(status_or_none(address))) and a["policy_version"] >= 2, 180, "training", every)
        frozen = relay.freeze()
        assert frozen >= 1
        # Items stop reaching the replay table through the frozen connection, until the actor has waited a while
        # for them, seen its connection unanswered where a new one is answered, and writes on a new connection.
        wait_for(lambda: "died silently" in actor.output(), 60, "the actor to find its connection dead", every)
        seen = []
        wait_for(lambda: seen.append(_actor(status_or_none(address))) or seen[-1], 30, "status", every)
        wait_for(
            lambda: (a := _actor(status_or_none(address))) and a["policy_version"] >= seen[-1]["policy_version"] + 2,
            90,
            "training to go on through a new replay connection",
            every,
        )
        assert "new writers on a new connection" in actor.output(), actor.output()
        # The items went through a connection opened after the freeze (not only the small probes).
        assert max(c["bytes"] for c in relay.connections[frozen:]) > 50_000, [c["bytes"] for c in relay.connections]
    finally:
        relay.close()
