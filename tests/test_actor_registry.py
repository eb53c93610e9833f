"""The learner's actor registry without any server: ids, counting, timeouts, rejoining, checkpoint records."""

from rlfleet.learner.actor_registry import ActorRegistry, ActorSeen


def test_counting_does_not_evict_and_eviction_keeps_the_steps():
    book = ActorRegistry(timeout_s=3)
    a, b = book.register("h1", "10.0.0.1", 8, now=0.0), book.register("h2", "10.0.0.2", 8, now=0.0)
    assert (a, b) == (0, 1)
    book.heartbeat(a, 100, 2, now=1.0)
    book.heartbeat(b, 50, 1, now=1.0)
    # Long after the timeout, counting still sees both and changes nothing.
    assert book.env_steps() == 150 and sorted(book.actors) == [0, 1]
    assert book.env_steps() == 150 and len(book.snapshot(now=100.0)) == 2
    book.heartbeat(
        a, 120, 3, now=9.0, seen=ActorSeen(env_backend="workers", env_backend_reason="auto chose workers: ...")
    )
    book.heartbeat(a, 120, 3, now=9.0)  # a heartbeat that does not say keeps what the last one said
    assert book.evict_stale(now=10.0) == [b]  # b's last heartbeat is 9 s old, a's 1 s
    assert book.env_steps() == 170  # b's 50 steps stay counted
    [row] = book.snapshot(now=10.0)
    assert row == dict(
        actor_id=0,
        host="h1",
        address="10.0.0.1",
        num_envs=8,
        policy_version=3,
        env_steps=120,
        seconds_since_heartbeat=1.0,
        env_backend="workers",
        env_backend_reason="auto chose workers: ...",
    )


def test_an_actor_that_comes_back_is_counted_from_where_it_left():
    book = ActorRegistry(timeout_s=3)
    a = book.register("h1", "10.0.0.1", 8, now=0.0)
    book.heartbeat(a, 100, 1, now=1.0)
    book.evict_stale(now=10.0)
    assert book.actors == {} and book.env_steps() == 100
    # It was paused, not dead: it comes back with its id and its own cumulative count.
    assert book.heartbeat(a, 180, 4, now=11.0, seen=ActorSeen("h1", "10.0.0.1", 8)) is True
    assert book.env_steps() == 180  # the 80 steps it took while away count once
    assert book.heartbeat(a, 190, 4, now=12.0) is False
    assert book.env_steps() == 190
    # A newcomer never takes the id of an actor that may still come back.
    book.evict_stale(now=20.0)
    assert book.register("h3", "10.0.0.3", 8, now=20.0) == 1


def test_checkpoint_record_round_trip():
    book = ActorRegistry(timeout_s=3)
    a, b = book.register("h1", "x", 8, now=0.0), book.register("h2", "y", 8, now=0.0)
    book.heartbeat(a, 100, 1, now=1.0)
    book.heartbeat(b, 40, 1, now=1.0)
    book.evict_stale(now=2.5)  # nobody is stale yet
    book.heartbeat(a, 110, 1, now=5.0)
    book.evict_stale(now=6.0)  # b is away
    record = book.progress()
    assert record == dict(next_actor_id=2, actor_env_steps={0: 110, 1: 40})
    # A restarted learner continues from the checkpoint's count (taken at 150 env steps).
    restored = ActorRegistry(
        3, base_env_steps=150, next_actor_id=record["next_actor_id"], away=record["actor_env_steps"]
    )
    assert restored.env_steps() == 150
    restored.heartbeat(a, 130, 2, now=0.0)  # 20 steps after the checkpoint
    assert restored.env_steps() == 170
    assert restored.register("h9", "z", 8, now=0.0) == 2  # ids 0 and 1 stay reserved for the old actors
    restored.heartbeat(b, 40, 2, now=0.0)  # b never moved: nothing new to count
    assert restored.env_steps() == 170


def test_an_actor_that_joined_after_the_checkpoint_counts_all_its_steps():
    # The old learner's book: actors 0 and 1 at the checkpoint (150 env steps); actor 2 joined after it.
    restored = ActorRegistry(3, base_env_steps=150, next_actor_id=2, away={0: 100, 1: 50}, restored=True)
    restored.heartbeat(0, 110, 5, now=0.0)
    restored.heartbeat(1, 50, 5, now=0.0)
    restored.heartbeat(2, 30, 5, now=0.0)  # none of its 30 steps are in the checkpoint's 150
    assert restored.env_steps() == 150 + 10 + 30
    # A restarted actor process (its own count fell below the one it left with) counts from now.
    again = ActorRegistry(3, base_env_steps=150, next_actor_id=2, away={0: 100, 1: 50}, restored=True)
    again.heartbeat(0, 7, 5, now=0.0)
    assert again.env_steps() == 150
    # A fresh learner (no checkpoint) knows nothing of an earlier process's actors: it counts from now.
    fresh = ActorRegistry(3)
    fresh.heartbeat(4, 500, 5, now=0.0)
    fresh.heartbeat(4, 520, 5, now=1.0)
    assert fresh.env_steps() == 20


def test_what_a_restored_learner_knows_of_ids_and_counts(tmp_path):
    from rlfleet.learner.run_dir import ACTOR_IDS_FILE, read_next_actor_id, read_progress, write_json, write_progress

    ckpt = str(tmp_path / "checkpoints" / "ckpt-3")
    # A checkpoint without a progress record (written before records existed): nothing says which actors its
    # count holds, so the learner must not take rejoining actors for ones that joined after it.
    assert read_progress(ckpt)["recorded"] is False
    old = ActorRegistry(3, base_env_steps=1000, restored=read_progress(ckpt)["recorded"])
    old.heartbeat(0, 610, 5, now=0.0)
    old.heartbeat(1, 400, 5, now=0.0)
    assert old.env_steps() == 1000  # not 2010: their steps are in the restored 1000
    # A record written before it kept its evaluations' seconds: none counted.
    write_progress(ckpt, dict(next_actor_id=2, wall_seconds=5.0, actor_env_steps={"0": 600, "1": 400}))
    assert read_progress(ckpt) == dict(
        next_actor_id=2, wall_seconds=5.0, evaluation_seconds=0.0, actor_env_steps={0: 600, 1: 400}, recorded=True
    )
    write_progress(ckpt, dict(next_actor_id=2, wall_seconds=5.0, evaluation_seconds=1.5, actor_env_steps={}))
    assert read_progress(ckpt)["evaluation_seconds"] == 1.5
    # Ids given out after the last checkpoint are on record too (the learner writes them at each registration).
    assert read_next_actor_id(str(tmp_path)) == 0
    write_json(str(tmp_path / ACTOR_IDS_FILE), dict(next_actor_id=4))
    assert read_next_actor_id(str(tmp_path)) == 4
