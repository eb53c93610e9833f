"""The DQN actor's frame-sharing replay items: each stores the newest frame per step of G envs side by side,
and the learner's decoding of the n + 4 frames of an item rebuilds exactly the stacked observations the policy
saw (real Reverb server and writers, items read through the learner's own input path; a scripted Atari-like
batched env whose frames encode the step that produced them)."""

import threading
import types

import numpy as np
import pytest
import reverb
import tensorflow as tf

from rlfleet import algorithms
from rlfleet.actors.actor import Actor, Policy
from rlfleet.actors.adders import collect
from rlfleet.algorithms.dqn.items import TABLE as DQN_TABLE
from rlfleet.algorithms.dqn.items import batches, dqn_signature, transitions
from rlfleet.algorithms.dqn.networks import CNN
from rlfleet.proto import rlfleet_pb2

N_STEP, STACK, ENVS, ENVS_PER_ITEM, STEPS = 3, 4, 4, 2, 120


class ScriptedFrames:
    """ENVS envs of 84x84 frames; pixel [0, 0] holds a unique frame id, [0, 1] the env. Episodes end
    by termination or (every third one) by truncation after 7-19 steps; stacks start with 3 zero frames."""

    single_observation_space = types.SimpleNamespace(shape=(STACK, 84, 84))

    def __init__(self, stop: threading.Event):
        self.rng, self.stop, self.next_id = np.random.default_rng(0), stop, 1
        self.seen = {}  # frame id of the newest frame -> the stacked observation the policy was given
        self.acted = [[] for _ in range(ENVS)]  # per env, frame ids of the observations acted on, in order
        self.truncated_tails = set()  # frame ids of the last n steps of truncated episodes
        self.ends = set()  # frame ids of the observations acted on at the last step of an episode
        self.steps = 0

    def _frame(self, env):
        f = np.zeros((84, 84), np.uint8)
        f[0, 0], f[0, 1] = self.next_id % 256, env
        f[0, 2] = self.next_id // 256
        self.next_id += 1
        return f

    def _reset(self, env):
        self.left[env] = int(self.rng.integers(7, 20))
        self.episodes[env] += 1
        stack = np.zeros((STACK, 84, 84), np.uint8)
        stack[-1] = self._frame(env)
        return stack

    def reset(self, seed=None):
        self.left, self.episodes = [0] * ENVS, [0] * ENVS
        self.obs = np.stack([self._reset(i) for i in range(ENVS)])
        return self.obs.copy(), {}

    def step(self, action):
        for i in range(ENVS):
            self.seen[_fid(self.obs[i, -1])] = self.obs[i].copy()
            self.acted[i].append(_fid(self.obs[i, -1]))
        term, trunc = np.zeros(ENVS, bool), np.zeros(ENVS, bool)
        for i in range(ENVS):
            self.left[i] -= 1
            if self.left[i] == 0:
                (trunc if self.episodes[i] % 3 == 0 else term)[i] = True
                self.ends.add(self.acted[i][-1])
                if trunc[i]:
                    self.truncated_tails.update(self.acted[i][-N_STEP:])
                self.obs[i] = self._reset(i)
            else:
                self.obs[i] = np.concatenate([self.obs[i, 1:], self._frame(i)[None]])
        self.steps += 1
        if self.steps >= STEPS:
            self.stop.set()
        return self.obs.copy(), np.ones(ENVS, np.float32), term, trunc, {}


def _fid(frame):
    return int(frame[0, 0]) + 256 * int(frame[0, 2])


def _bare_actor():
    """A Reverb server with the Atari DQN table, an Actor without a learner (its collection loop alone) writing
    to it, and random-policy weights. Returns (server, actor, weights)."""
    server = reverb.Server(
        [
            reverb.Table.queue(
                DQN_TABLE, 10_000, signature=dqn_signature((84, 84), tf.uint8, N_STEP, STACK, ENVS_PER_ITEM)
            )
        ]
    )
    actor = Actor.__new__(Actor)
    actor.config = rlfleet_pb2.RunConfig(
        algo="dqn",
        env_id="Scripted-v0",
        table=DQN_TABLE,
        num_envs=ENVS,
        unroll_length=N_STEP,
        envs_per_item=ENVS_PER_ITEM,
        seed=0,
    )
    actor.replay_address, actor.frame_stack = f"localhost:{server.port}", STACK
    actor.stop, actor.lock = threading.Event(), threading.Lock()
    actor.env_steps, actor.policy_version, actor.pending_returns, actor.pending_lengths = 0, -1, [], []
    actor.replay_epoch, actor._restarts = 0, 0
    weights = types.SimpleNamespace(
        latest=Policy(0, CNN("nature_cnn", STACK, (84, 84), 6, 0, "q").export(), rlfleet_pb2.Exploration(epsilon=1.0)),
        serial=0,
    )
    return server, actor, weights


def _all_items(address):
    """Every item of the table, in one batch of the signature's shapes ({field: [K, ...]})."""
    client = reverb.Client(address)
    size = client.server_info()[DQN_TABLE].current_size
    items = list(client.sample(DQN_TABLE, num_samples=size, emit_timesteps=False, unpack_as_table_signature=True))
    return {k: np.stack([item.data[k] for item in items]) for k in items[0].data}


def test_items_rebuild_the_stacked_observations():
    server, actor, weights = _bare_actor()
    address = actor.replay_address
    venv = ScriptedFrames(actor.stop)
    collect(algorithms.get("dqn"), actor, venv, weights, 0)

    data = _all_items(address)
    assert data["observation"].shape[1:] == (N_STEP + STACK, ENVS_PER_ITEM, 84, 84)
    t = {k: v.numpy() for k, v in transitions(data, N_STEP, STACK).items()}
    assert len(t["action"]) > 0.6 * STEPS * ENVS
    starts = set()
    for i in range(len(t["action"])):
        obs, bootstrap = t["observation"][i], t["next_observation"][i]
        fid = _fid(obs[-1])
        assert fid not in starts  # one transition per env step
        starts.add(fid)
        np.testing.assert_array_equal(obs, venv.seen[fid])  # the stack the policy acted on
        env = obs[-1][0, 1]
        assert t["valid"][i] == (fid not in venv.truncated_tails)  # no bootstrap observation behind a cut
        if not t["done"][i].any():  # the bootstrap stack, N_STEP steps later in the same episode
            np.testing.assert_array_equal(bootstrap, venv.seen[_fid(bootstrap[-1])])
            assert bootstrap[-1][0, 1] == env
            assert venv.acted[env].index(_fid(bootstrap[-1])) == venv.acted[env].index(fid) + N_STEP
        else:  # the step whose episode ended first is the first done
            k = int(np.argmax(t["done"][i]))
            assert venv.acted[env][venv.acted[env].index(fid) + k] in venv.ends
        assert t["reward"][i].tolist() == [1.0] * N_STEP and t["policy_version"][i] == 0
    # Every env step has its transition, except, per env, the last n (windows not complete yet) plus up to 32
    # batch steps (the items a writer may still have in flight when the actor stops: it closes without flushing).
    assert venv.truncated_tails and venv.truncated_tails & starts
    assert starts <= set(venv.seen)
    assert set(venv.seen) - starts <= {f for env_ids in venv.acted for f in env_ids[-(N_STEP + 32) :]}
    server.stop()


def test_the_learner_reads_the_items_inserted():
    """The learner's input path (`batches`: Reverb's dataset, decoding in its graph) gives minibatches whose
    transitions are all among those the actor wrote, as many and of the size asked for."""
    server, actor, weights = _bare_actor()
    venv = ScriptedFrames(actor.stop)
    collect(algorithms.get("dqn"), actor, venv, weights, 0)
    minibatches = batches(actor.replay_address, 5, N_STEP, STACK, minibatches=2)
    for _ in range(3):
        batch = next(minibatches)
        assert batch["observation"].shape == (2, 5, STACK, 84, 84) and batch["action"].shape == (2, 5)
        for obs in batch["observation"].numpy().reshape(10, STACK, 84, 84):
            np.testing.assert_array_equal(obs, venv.seen[_fid(obs[-1])])
    minibatches.close()
    server.stop()


class NaNAfter(ScriptedFrames):
    """The scripted env, but env 1 reports a NaN reward at step 30."""

    def step(self, action):
        obs, reward, term, trunc, info = super().step(action)
        if self.steps == 30:
            reward = reward.copy()
            reward[1] = np.nan
        return obs, reward, term, trunc, info


def test_a_nan_reward_stops_the_actor_before_it_reaches_replay():
    from rlfleet.actors.actor import ActorError

    server, actor, weights = _bare_actor()
    address = actor.replay_address
    with pytest.raises(ActorError, match=r"Scripted-v0 \(env 1 of this actor\) returned a non-finite reward"):
        collect(algorithms.get("dqn"), actor, NaNAfter(actor.stop), weights, 0)
    assert actor.env_steps == 29 * ENVS  # the bad step was not counted
    client = reverb.Client(address)
    size = client.server_info()[DQN_TABLE].current_size
    assert size > 0  # what was collected before stays
    assert np.isfinite(_all_items(address)["reward"]).all()
    server.stop()
