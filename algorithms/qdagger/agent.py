"""QDagger: reincarnate a DQN student from a teacher's Q-network and replay (Agarwal et al. 2022, Sec. 4).

Offline phase (`offline_pretraining`): before any env step, the student takes
`offline_steps` gradient steps on minibatches of the teacher's replay (a Reverb
checkpoint restored read-only, `rlfleet.replay.checkpoints.open_teacher_replay`), with
the QDagger loss: Huber TD loss on n-step targets + λ·KL(softmax(Q_T/τ) ‖
softmax(Q_S/τ)). Online phase (`online`): the student's weights go to the
actors, which fill the student's own replay table; the teacher labels the
student's minibatches with its Q-values for the same loss. The target network is
copied from the student when the online phase begins. After every online
evaluation λ = base·max(0, 1 − (R_S − R_rand)/(R_T − R_rand)), R_S the mean
return of the latest `distillation_score_episodes` online evaluation episodes
(λ holds its value until that many were played; evaluations of the offline
phase, the one at its end included, never move it), R_T the teacher's
(`teacher_eval_episodes`) and R_rand a uniformly random policy's evaluation
return, both measured at start; λ is forced to 0 after
`distillation_cutoff_env_steps` online env steps, and once 0 it stays 0. The
learning rate moves with λ from `learning_rate` to `learning_rate_final`.
Values: reincarnating_rl QDagger configs (base 3.0, τ 0.1, lr 1e-4 → 1e-5; the classic-control preset uses
τ 1.0, see `rlfleet.algorithms.qdagger.config`);
its students decay λ only from online scores, once per 250k-agent-step
iteration, each from a 125k-agent-step evaluation (`record_score`).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import tensorflow as tf

from rlfleet.algorithms.base import StepResult
from rlfleet.algorithms.dqn import losses
from rlfleet.algorithms.dqn.agent import DQNAgent, evaluate_q, passed_multiple
from rlfleet.algorithms.dqn.items import GUIDE_PREFIX, batches
from rlfleet.algorithms.dqn.networks import export_q
from rlfleet.algorithms.library.evaluation import run_batched_episodes
from rlfleet.algorithms.qdagger.config import QDaggerConfig
from rlfleet.algorithms.qdagger.outside import IMPORTED, ModelQ
from rlfleet.algorithms.qdagger.teacher import Teacher, check_guide
from rlfleet.common.logs import NOTICE, logger
from rlfleet.common.progress_line import ProgressLine
from rlfleet.envs.core import EnvSpec

log = logger("qdagger")

OFFLINE, ONLINE = "offline_pretraining", "online"
# Evaluation seeds of the teacher and of the random policy at start: far from the student's own evaluation
# seeds (`evaluation.evaluation_seed` + episode), so that no student evaluates on the episodes that define its target.
TEACHER_EVAL_SEED, RANDOM_EVAL_SEED = 10**9, 10**9 + 10**5
# With teacher_eval_episodes 0 the teacher is measured over eval_episodes as a student evaluation is, on the seeds
# just after the student's first evaluation seed.
STUDENT_LIKE_EVAL_SEEDS = 10**6 + 1, 10**6 + 2


class QDaggerAgent(DQNAgent):
    """The QDagger student (see module doc).

    Args:
        spec: env spec (discrete actions).
        config: `QDaggerConfig`.
        seed: initialisation seed of the student.
        teacher: the loaded teacher (`rlfleet.algorithms.qdagger.teacher.load_teacher`).
        teacher_replay: host:port of the Reverb server holding the teacher's restored table.
    """

    algo = "qdagger"

    def __init__(self, spec: EnvSpec, config: QDaggerConfig, seed: int, teacher: Teacher, teacher_replay: str):
        super().__init__(spec, config, seed)
        self.teacher, self.teacher_replay = teacher, teacher_replay
        self.coefficient = tf.Variable(config.distillation_base, dtype=tf.float32)
        # The large-margin and CQL terms' weights (`QDaggerConfig`): the margin's decays with λ's schedule, the
        # CQL term's is 0 from the online phase on.
        self.margin_weight = tf.Variable(config.margin_coefficient, dtype=tf.float32)
        self.cql_weight = tf.Variable(config.cql_coefficient, dtype=tf.float32)
        self.teacher_return = math.nan
        self.random_return = math.nan
        self.online_start_env_steps = tf.Variable(-1, dtype=tf.int64)  # env steps when the online phase began
        # The latest online evaluation returns (a ring of distillation_score_episodes) and how many were played.
        self.score_returns = tf.Variable(tf.zeros([max(1, config.distillation_score_episodes)], tf.float32))
        self.score_played = tf.Variable(0, dtype=tf.int64)
        self.score_return = math.nan  # R_S that λ was last set from
        self._offline_progress = ProgressLine("offline pretraining", "learner steps")
        # JSRL: the bound H of the teacher's roll-in on the actors (`guide_bound`), and the teacher's weights.
        self._guide_h = config.guide_roll_in_steps
        self._guide_arrays = guide_weights(teacher) if config.guide_roll_in_steps else {}
        self._set_learning_rate()

    def checkpoint_items(self) -> dict:
        items = dict(
            super().checkpoint_items(),
            distillation_coefficient=self.coefficient,
            online_start_env_steps=self.online_start_env_steps,
        )
        if self.config.margin_coefficient:  # a DQfD student's decaying margin weight
            items.update(margin_weight=self.margin_weight)
        if self.config.distillation_score_episodes:  # 0: no window of scores to keep
            items.update(distillation_score_returns=self.score_returns, distillation_score_played=self.score_played)
        return items

    def export_weights(self) -> dict:
        """The student's Q-network, and while the teacher still guides (H >= 1) its Q-network under
        `GUIDE_PREFIX`."""
        weights = super().export_weights()
        if self._guide_steps():
            weights.update(self._guide_arrays)
        return weights

    def exploration(self) -> dict:
        return dict(super().exploration(), guide_roll_in_steps=self._guide_steps())

    def _guide_steps(self) -> int:
        """H, the most steps the teacher acts at the start of an episode (0: it does not)."""
        return self._guide_h

    def _set_guide(self, env_steps: int) -> None:
        """H at `env_steps` (`guide_bound`); the online phase's start is a checkpointed variable, so H needs no
        state of its own."""
        c, start = self.config, int(self.online_start_env_steps.numpy())
        online_steps = env_steps - start if start >= 0 else 0
        self._guide_h = guide_bound(c.guide_roll_in_steps, c.guide_roll_in_decay, c.guide_roll_in_period_env_steps,
                                    online_steps)  # fmt: skip

    def sync_from_checkpoint(self) -> None:
        if self.phase == ONLINE:
            self.cql_weight.assign(0.0)
        self._set_learning_rate()
        window = self.config.distillation_score_episodes
        if window and int(self.score_played.numpy()) >= window:
            self.score_return = float(np.mean(self.score_returns.numpy()))

    @property
    def phase(self) -> str:
        return OFFLINE if int(self.learner_steps.numpy()) < self.config.offline_steps else ONLINE

    def ready_for_actors(self) -> bool:
        return self.phase == ONLINE

    def on_start(self) -> None:
        """Measures the teacher's (`teacher_eval_episodes`) and a uniformly random policy's evaluation returns
        (λ's normalisation)."""
        c = self.config
        episodes = c.teacher_eval_episodes or c.eval_episodes
        seeds = (TEACHER_EVAL_SEED, RANDOM_EVAL_SEED) if c.teacher_eval_episodes else STUDENT_LIKE_EVAL_SEEDS
        returns = evaluate_q(
            self.teacher.numpy_q, self.spec.env_id, episodes, seeds[0], c.epsilon_eval, "teacher evaluation"
        )
        self.teacher_return = float(np.mean(returns))
        rng = np.random.default_rng(1)
        self.random_return = float(
            np.mean(
                run_batched_episodes(
                    self.spec.env_id,
                    c.random_eval_episodes,
                    seeds[1],
                    lambda obs: rng.integers(0, self.spec.action_dim, len(obs)),
                    progress="random policy evaluation",
                ).returns
            )
        )
        if not self.teacher_return > self.random_return:
            log.warning(
                "the teacher's evaluation return %.1f is not above a random policy's %.1f: the distillation "
                "coefficient stays at its base value until the cutoff",
                self.teacher_return,
                self.random_return,
            )
        log.log(
            NOTICE,
            "teacher %s evaluates at %.1f (%d episodes), a random policy at %.1f",
            self.teacher.directory,
            self.teacher_return,
            episodes,
            self.random_return,
        )

    def samples(self, replay_address: str):
        """The remaining offline minibatches from the teacher's replay, then the student's own, K =
        `gradient_steps_per_call` at a time (the offline phase's last ones fewer, so that it ends on its step);
        online with `teacher_data_ratio` > 0, each transition is the teacher's with that chance (`mix`)."""
        c = self.config
        remaining = max(0, c.offline_steps - int(self.learner_steps.numpy()))
        k, stack = c.gradient_steps_per_call, self.spec.frame_stack
        teacher = lambda minibatches: batches(self.teacher_replay, c.batch_size, c.n_step, stack, minibatches)
        if remaining >= k:
            yield from itertools.islice(teacher(k), remaining // k)
        if remaining % k:
            yield from itertools.islice(teacher(1), remaining % k)
        own = batches(replay_address, c.batch_size, c.n_step, stack, k, with_info=c.prioritized)
        if c.teacher_data_ratio:
            rng = np.random.default_rng(int(self.learner_steps.numpy()))
            yield from (mix(mine, theirs, c.teacher_data_ratio, rng) for mine, theirs in zip(own, teacher(k)))
            return
        self._open_priorities(replay_address)
        yield from own

    @tf.function
    def _qdagger_step(self, batch):
        """`_distillation_step` as a graph of its own (one minibatch, learner steps not counted)."""
        return self._distillation_step(batch)

    @tf.function
    def _qdagger_steps(self, minibatches):
        """`_distillation_step` on each of the K minibatches of `minibatches` in one graph (`_steps_in_graph`),
        the teacher's Q-values of all K labelled first in one forward pass (one host call for an ONNX teacher)."""
        c = self.config
        if c.distillation_base or c.margin_coefficient:
            obs = minibatches["observation"]
            shape = tf.shape(obs)
            teacher_q = self.teacher.q(tf.reshape(obs, tf.concat([[-1], shape[2:]], 0)))
            minibatches = dict(minibatches, teacher_q=tf.reshape(teacher_q, [shape[0], shape[1], -1]))
        return self._steps_in_graph(self._distillation_step, minibatches)

    def _distillation_step(self, batch):
        """One gradient step of the reincarnation loss on a minibatch ([N, ...] fields): TD + λ·distillation +
        margin weight · large margin toward the teacher's greedy action + CQL weight · CQL term; returns (TD loss,
        distillation loss, large-margin loss, CQL loss, mean Q, the items' new priorities
        (`DQNAgent._td_loss`))."""
        c = self.config
        valid = batch["valid"]
        # A term whose setting is 0 is never computed (the settings are fixed when the step is traced): no teacher
        # forward pass without distillation or margin, no CQL term without its coefficient.
        distill = margin = cql = tf.constant(0.0)
        with tf.GradientTape() as tape:
            td, q_all, mean_q, priorities = self._td_loss(batch)
            loss = td
            teacher_q = batch.get("teacher_q")  # [N, A], with distillation or a margin (`_qdagger_steps`)
            if c.distillation_base:
                distill = losses.distillation_loss(q_all, teacher_q, c.distillation_temperature)
                distill = losses.weighted_mean(distill, valid)
                loss += self.coefficient * distill
            if c.margin_coefficient:
                teacher_actions = tf.argmax(teacher_q, axis=-1, output_type=tf.int32)
                margin = losses.weighted_mean(losses.large_margin_loss(q_all, teacher_actions, c.margin), valid)
                loss += self.margin_weight * margin
            if c.cql_coefficient:
                cql = losses.weighted_mean(losses.cql_loss(q_all, batch["action"], c.distillation_temperature), valid)
                loss += self.cql_weight * cql
        grads = tape.gradient(loss, self.q.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.q.trainable_variables))
        return td, distill, margin, cql, mean_q, priorities

    def _reusing(self) -> bool:
        """Whether any term still draws on the teacher (λ, the margin weight or the CQL weight above 0)."""
        return any(float(v.numpy()) > 0 for v in (self.coefficient, self.margin_weight, self.cql_weight))

    def consume(self, batch, policy_version: int, env_steps: int) -> StepResult:
        c = self.config
        k = int(batch["action"].shape[0])
        zero = tf.constant(0.0)
        if self._reusing():
            td, distill, margin, cql, mean_q, priorities = self._qdagger_steps(batch)
        else:  # nothing draws on the teacher any more: plain DQN, no teacher forward pass
            (td, mean_q, priorities), distill, margin, cql = self._train_steps(batch), zero, zero, zero
        self._update_priorities(batch, priorities)
        steps = int(self.learner_steps.numpy())

        def metrics() -> dict:  # read back only when reported (each read waits for the step)
            out = {
                "td_loss": float(td),
                "distillation_loss": float(distill),
                "mean_q": float(mean_q),
                "distillation_coefficient": float(self.coefficient.numpy()),
                "epsilon": self.epsilon,
            }
            if c.margin_coefficient:
                out.update(margin_loss=float(margin), margin_weight=float(self.margin_weight.numpy()))
            if c.cql_coefficient:
                out.update(cql_loss=float(cql))
            if c.guide_roll_in_steps:
                out.update(guide_roll_in_steps=self._guide_steps())
            return out

        if steps < c.offline_steps:
            self._offline_progress.update(steps, c.offline_steps)
            evaluate = passed_multiple(steps, k, c.publish_every * c.eval_every_updates)
            return StepResult(gradient_steps=k, evaluate=evaluate, metrics=metrics() if evaluate else {})
        start = int(self.online_start_env_steps.numpy())
        if steps == c.offline_steps or start < 0:
            # The offline phase's end (with offline_steps 0: the first step): actors start with these weights.
            self.online_start_env_steps.assign(env_steps)
            self.cql_weight.assign(0.0)  # a term of the offline phase alone
            self._set_learning_rate()
            if steps % c.target_update_period:  # the online phase bootstraps from the student as it is now
                self._copy_target()
            done = f"offline pretraining done ({steps} gradient steps)" if c.offline_steps else "no offline pretraining"
            log.log(NOTICE, "%s; online phase", done)
            return StepResult(gradient_steps=k, updated=True, evaluate=True, metrics=metrics())
        online_steps = env_steps - start
        if c.distillation_cutoff_env_steps and online_steps >= c.distillation_cutoff_env_steps and self._reusing():
            self.coefficient.assign(0.0)
            self.margin_weight.assign(0.0)
            self._set_learning_rate()
        if not passed_multiple(steps, k, c.publish_every):
            return StepResult(gradient_steps=k)
        self.epsilon = losses.linear_epsilon(online_steps, c.epsilon_start, c.epsilon_end, c.epsilon_decay_env_steps)
        self._set_guide(env_steps)
        return StepResult(gradient_steps=k, updated=True, metrics=metrics())

    def on_resume(self, env_steps: int) -> None:
        """ε at its schedule's point in the online phase (ε_start before it)."""
        c = self.config
        start = int(self.online_start_env_steps.numpy())
        online_steps = env_steps - start if start >= 0 else 0
        self.epsilon = losses.linear_epsilon(online_steps, c.epsilon_start, c.epsilon_end, c.epsilon_decay_env_steps)
        self._set_guide(env_steps)

    def on_evaluation(self, returns: list[float], env_steps: int) -> None:
        """Online: records the evaluation's episode returns and sets λ (and the learning rate with it) from the
        mean of the latest `distillation_score_episodes` of them, once that many were played."""
        c = self.config
        start = int(self.online_start_env_steps.numpy())
        # Learner steps, not env steps, tell the evaluation at the end of the offline phase: actors already step
        # while it runs.
        if int(self.learner_steps.numpy()) <= c.offline_steps or start < 0:
            return  # offline (and at its end) the student distils at the base coefficient: no online data yet
        if not self._reusing():
            return
        window = c.distillation_score_episodes
        if window:
            ring, played = self.score_returns.numpy(), int(self.score_played.numpy())
            for r in returns:
                ring[played % window] = r
                played += 1
            self.score_returns.assign(ring)
            self.score_played.assign(played)
            if played < window:
                return  # too few episodes yet for a score that one lucky evaluation cannot fake
            score = float(np.mean(ring))
        else:
            score = float(np.mean(returns))
        if not self.teacher_return > self.random_return:
            return
        self.score_return = score
        online_steps = max(0, env_steps - start)
        # λ and the margin weight decay alike: the share of the teacher's lead over random that is still to go.
        decay = losses.distillation_coefficient(
            1.0, score, self.teacher_return, self.random_return, online_steps, c.distillation_cutoff_env_steps or None
        )
        self.coefficient.assign(c.distillation_base * decay)
        self.margin_weight.assign(c.margin_coefficient * decay)
        self._set_learning_rate()

    def _set_learning_rate(self) -> None:
        """λ/base interpolates the learning rate from `learning_rate` to `learning_rate_final`; without
        distillation (base 0) it is `learning_rate` offline and `learning_rate_final` online."""
        c = self.config
        if c.distillation_base > 0:
            rate = losses.interpolated_learning_rate(
                float(self.coefficient.numpy()), c.distillation_base, c.learning_rate, c.learning_rate_final
            )
        else:
            rate = c.learning_rate if self.phase == OFFLINE else c.learning_rate_final
        self.optimizer.learning_rate.assign(rate)

    def status_extras(self) -> dict:
        extras = {
            "phase": self.phase,
            "distillation_coefficient": float(self.coefficient.numpy()),
            "teacher_eval_return_mean": self.teacher_return,
            "random_eval_return_mean": self.random_return,
            "distillation_score_return": self.score_return,
        }
        if self.config.margin_coefficient:
            extras["margin_weight"] = float(self.margin_weight.numpy())
        if self.config.guide_roll_in_steps:
            extras["guide_roll_in_steps"] = self._guide_steps()
        return extras


def guide_bound(first: int, decay: float, period: int, online_steps: int) -> int:
    """JSRL's roll-in bound H after `online_steps` online env steps: `first`, made int(H · decay) once every
    `period` env steps (reincarnating_rl's JSRLAgent: `max_roll_in_steps = int(max_roll_in_steps ·
    decay_roll_in_steps)` once per iteration). 0 stays 0; `period` 0 never decays."""
    h = first
    for _ in range(online_steps // period if period else 0):
        shrunk = int(h * decay)
        if shrunk == h:  # 0, or a decay of 1: no more change (at most `first` turns of the loop)
            break
        h = shrunk
    return h


def guide_weights(teacher: Teacher) -> dict:
    """The teacher's Q-network as the actors' weights under `GUIDE_PREFIX` (JSRL's guide).

    Raises:
        TeacherError: a teacher given as a model file (`rlfleet import-teacher`): the actors run only rlfleet's
            own Q-networks.
    """
    if isinstance(teacher.q, ModelQ):
        check_guide(teacher.directory, {"algo": IMPORTED, "model": {"format": teacher.q.fmt}})
    return {GUIDE_PREFIX + k: v for k, v in export_q(teacher.q).items()}


def mix(own: dict, teacher: dict, ratio: float, rng: np.random.Generator) -> dict:
    """Minibatches whose transitions are each the teacher's (from `teacher`) with probability `ratio`, else the
    student's (from `own`): fields [K, N, ...] of `rlfleet.algorithms.dqn.items.transitions` in both.
    Source: rehearsal as reincarnating_rl's pretrained_dqn agent mixes the teacher's data into online minibatches
    (`teacher_data_ratio`, a coin per transition)."""
    shape = own["action"].shape
    take = tf.constant(rng.random(tuple(shape)) < ratio)
    out = {}
    for field, mine in own.items():
        mask = tf.reshape(take, tuple(shape) + (1,) * (len(mine.shape) - 2))
        out[field] = tf.where(mask, teacher[field], mine)
    return out


def make_agent(
    spec: EnvSpec, config: QDaggerConfig, seed: int, total_steps: int = 0, *, teacher: str, teacher_replay: str
) -> QDaggerAgent:
    """The QDagger learner for the registry (`rlfleet.algorithms.qdagger`): loads the teacher run directory
    `teacher` (its Q-network) and reads its replay from `teacher_replay` (host:port). Its schedules follow
    the distillation coefficient, so `total_steps` is not used.

    Raises:
        TeacherError (a ValueError): `teacher` is not a usable teacher for `spec`.
    """
    from rlfleet.algorithms.qdagger.teacher import load_teacher

    return QDaggerAgent(spec, config, seed, load_teacher(teacher, spec), teacher_replay)
