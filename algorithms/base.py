"""The interfaces an algorithm implements, in one module that imports no algorithm (and no TensorFlow).

An algorithm is an `AlgorithmBuilder` subclass registered with `rlfleet.algorithms.register`. Its typed methods
give each process what it needs of it: the settings dataclass and presets (CLI, every process), the replay
tables (replay server), the behaviour policy and replay writer (actors), the `Agent` (learner). A builder's
methods import the algorithm's modules when called, so that importing a builder (the CLI does at start-up)
imports no TensorFlow.

A settings dataclass declares the range of each numeric field in its type (`Range`, through the aliases
`Positive`, `Fraction`, `Count`, ...) and the values of a named-choice field with `OneOf`; `rlfleet up` refuses
a value outside them before anything starts (`rlfleet.algorithms.settings.build_config`). Each field's
declaration ends with a comment giving its meaning and unit (`rlfleet up --show-config` prints them). It must
have a `to_json()` method and the fields `envs_per_actor` (envs each actor steps), `eval_episodes` and
`eval_every_updates` (evaluation cadence, in policy versions); `unroll_length` (batch steps per item) where its
items hold more than one step.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Generic, NamedTuple, TypeVar

if TYPE_CHECKING:  # for annotations only: importing them here would import TensorFlow (and the floors above)
    import numpy as np
    import reverb

    from rlfleet.actors.actor import Policy
    from rlfleet.actors.adders import Act, Adder
    from rlfleet.actors.writers import ActorContext, WeightsView
    from rlfleet.algorithms.settings import RunSettings
    from rlfleet.envs.core import EnvSpec

C = TypeVar("C")  # an algorithm's settings dataclass
# An actors' behaviour policy: (the latest weights, observations [B, ...], the actor's generator) -> its `Act`.
Behaviour = Callable[["Policy", "np.ndarray", "np.random.Generator"], "Act"]


@dataclasses.dataclass(frozen=True)
class Range:
    """The valid values of a numeric setting: finite, from `low` to `high` (None: unbounded), each bound included
    unless its `*_open` is set; for a tuple setting (layer widths), every element, and at least one. A config
    field declares it in its type, `typing.Annotated[float, Range(...)]` (the aliases below), and `build_config`
    refuses any value outside it before anything starts."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value) -> bool:
        values = value if isinstance(value, tuple) else (value,)
        return bool(values) and all(self._holds(v) for v in values)

    def _holds(self, v) -> bool:
        if not math.isfinite(v):
            return False
        if self.low is not None and (v < self.low or (self.low_open and v == self.low)):
            return False
        return self.high is None or (v < self.high or (not self.high_open and v == self.high))

    def __str__(self) -> str:
        if self.low is not None and self.high is not None:
            return f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        if self.high is not None:
            return f"{'<' if self.high_open else '<='} {self.high:g}"
        return "finite"


# The ranges settings are declared with (each field's comment says what a bound value such as 0 means).
Positive = Annotated[float, Range(0, low_open=True)]  # > 0
NonNegative = Annotated[float, Range(0)]  # >= 0
Fraction = Annotated[float, Range(0, 1)]  # in [0, 1]
Discount = Annotated[float, Range(0, 1, low_open=True)]  # γ in (0, 1]
Count = Annotated[int, Range(1)]  # >= 1
Count0 = Annotated[int, Range(0)]  # >= 0
Widths = Annotated[tuple, Range(1)]  # layer widths: at least one, each >= 1


@dataclasses.dataclass(frozen=True)
class Choice:
    """The valid values of a named-choice setting (`OneOf`)."""

    values: tuple


def OneOf(*values: str):
    """The type of a setting that takes one of `values` (strings), e.g. `reward_scale: OneOf("rms", "none")`."""
    return Annotated[str, Choice(tuple(values))]


LrSchedule = OneOf("constant", "linear")  # a learning rate held constant, or annealed linearly over the budget


class CreditLimit(NamedTuple):
    """Asynchronous collection's limit on how far actors run ahead of the learner, as the learner sends it with
    each policy version (`Weights.item_share`, `Weights.max_policy_lag`) and an actor keeps to it
    (`rlfleet.actors.writers.ItemCredit`). The default, (0.0, 0), is no limit."""

    item_share: float = 0.0  # replay items per policy version each actor may write (the batch's items / actors)
    max_policy_lag: int = 0  # policy versions' worth of items beyond the trained ones an actor may hold


class ReplaySource(NamedTuple):
    """A replay besides the run's own that an algorithm learns from (QDagger: its teacher's), served read-only by
    a replay server of its own (`rlfleet replay --teacher DIR` serves the replay checkpoint of the run directory
    DIR, a read-only copy) and read by the learner (`rlfleet learner --replay-source NAME=HOST:PORT`).

    name: what status and messages call it (status lists its tables as NAME/TABLE; `rlfleet up` logs its server
        as NAME-replay and keeps the copy in RUN/NAME_replay); run_dir: the run directory whose replay it is;
    address: host:port of the replay server serving it ("" where none is known yet).
    """

    name: str
    run_dir: str
    address: str = ""


@dataclasses.dataclass
class StepResult:
    """What consuming one replay sample did.

    gradient_steps: learner steps taken; consumed / dropped: env steps trained
    on / discarded for policy lag; updated: the weights changed enough to
    publish a new policy version; evaluate: evaluate now (besides the
    service's every-`eval_every_updates` evaluations); metrics: floats for
    logs and TensorBoard. A NaN/inf in a metric whose name contains "loss",
    or in `export_weights()` when a version is published or checkpointed, is
    taken as divergence: the learner stops with its fault (docs: Faults and recovery).
    """

    gradient_steps: int = 0
    consumed: int = 0
    dropped: int = 0
    updated: bool = False
    evaluate: bool = False
    metrics: dict = dataclasses.field(default_factory=dict)


class Agent(abc.ABC):
    """An algorithm inside the learner service.

    The service (`rlfleet.learner.service.Learner`) owns the gRPC API, counters, checkpoints, metrics and the
    run's end; an agent owns the algorithm: its replay table and signature, how items are read and turned into
    updates, the weights actors receive, and evaluation.
    """

    algo: str
    table: str
    config: object
    spec: EnvSpec
    unroll_length: int  # items hold unroll_length + 1 consecutive steps (RunConfig.unroll_length)
    envs_per_item: int = 0  # envs whose steps share one item, side by side (RunConfig.envs_per_item; 0: not used)
    prefetch: int = 2  # samples the learner's sampler thread holds ready beyond the one being consumed

    @abc.abstractmethod
    def signature(self) -> dict:
        """The replay table signature this agent reads (tf.TensorSpec per field)."""

    def signature_error(self, signature: dict | None, source: str | None = None) -> str | None:
        """Why a replay table of `signature` (tf.TensorSpec per field, None: none) cannot be read by this agent,
        as the rest of a sentence; None when it can. `source`: the name of the `ReplaySource` the table belongs to
        (None: the run's own table). The default
        asks for `signature()` exactly (field names, shapes and dtypes)."""
        as_shapes = lambda sig: {k: (tuple(v.shape), v.dtype) for k, v in (sig or {}).items()}
        if as_shapes(signature) == as_shapes(self.signature()):
            return None
        shapes = lambda sig: {k: list(v.shape) for k, v in sorted((sig or {}).items())}
        return f"the table holds {shapes(signature)}, this run needs {shapes(self.signature())}"

    @abc.abstractmethod
    def actor_network(self) -> dict:
        """What actors need besides the weights, as fields of the `NetworkSpec` message (proto/rlfleet.proto):
        observation_shape, num_actions or action_dim and action bounds, ...; another key fails at start."""

    @abc.abstractmethod
    def export_weights(self) -> dict:
        """Named numpy arrays for the actors' policy (normalizer statistics included)."""

    def items_per_actor(self, num_actors: int) -> int:
        """Replay items each actor is to write with the policy version published now, then wait for the next
        (`Weights.items_per_actor`; 0: no limit, asynchronous collection). `num_actors`: actors registered now."""
        return 0

    def item_credit(self, num_actors: int) -> CreditLimit:
        """Asynchronous collection's limit on how far actors run ahead (`CreditLimit`; the default: no limit).
        `num_actors`: actors registered now."""
        return CreditLimit()

    def on_idle(self, policy_version: int, env_steps: int, num_actors: int) -> StepResult | None:
        """Called when no sample came for a while (about half a second); `num_actors`: actors registered now.
        A result is handled as `consume`'s is (e.g. an update on a batch that can no longer fill up)."""
        return None

    def exploration(self) -> dict:
        """The behaviour policy's exploration for the weights published now, as fields of the `Exploration`
        message (e.g. {"epsilon": 0.05}); {} for none (PPO samples from its policy)."""
        return {}

    @abc.abstractmethod
    def checkpoint_items(self) -> dict:
        """Trackables for `tf.train.Checkpoint` (networks, optimizers, state variables)."""

    def sync_to_checkpoint(self) -> None:
        pass

    def sync_from_checkpoint(self) -> None:
        pass

    @abc.abstractmethod
    def samples(self, replay_address: str):
        """Yields replay samples (blocking); runs on the learner's sampler thread."""

    @abc.abstractmethod
    def consume(self, sample, policy_version: int, env_steps: int) -> StepResult:
        """Uses one sample from `samples`; `policy_version` is the latest published policy version."""

    @abc.abstractmethod
    def evaluate(self, episodes: int, seed: int) -> list[float]:
        """Undiscounted returns of `episodes` evaluation episodes (the algorithm's evaluation policy)."""

    # How `evaluate` plays its episodes, which `rlfleet eval` repeats: all in one batch of envs (True), or one
    # after another in one env (`rlfleet.algorithms.library.evaluation.evaluate_policy`).
    evaluation_batched: ClassVar[bool] = False

    # Where the metrics of `consume`'s results go. False: the latest ones ride on the next metrics row (one
    # every report interval). True: each update (a result with `updated` and metrics) writes a metrics row of
    # its own, with the counters after it, as a per-update log does (CleanRL, Stable-Baselines3), and the rows
    # every report interval carry only the metrics of results without `updated`. For algorithms whose updates
    # come a few a second at most.
    metrics_every_update: ClassVar[bool] = False

    def policy(self, stochastic: bool, seed: int):
        """The current weights' policy as a function, observations [B, *obs_shape] -> env actions [B, ...] (what
        `rlfleet eval` runs): `stochastic` False gives the evaluation policy `evaluate` runs (PPO: the mean
        action; DQN: ε-greedy with the evaluation ε), True the behaviour policy the actors run (PPO: a sample
        of the Gaussian; DQN: ε-greedy with the exploration ε of the weights). `seed` seeds its random draws.

        Raises:
            NotImplementedError: the algorithm does not give one (`rlfleet eval` then says so).
        """
        raise NotImplementedError(f"algorithm {self.algo} gives no policy() for rlfleet eval.")

    def serving_module(self):
        """The evaluation policy of the current weights as a `tf.Module` for `rlfleet export`: its `serve`
        attribute is a `tf.function` with an input signature (one tensor, "observations" [None, *obs_shape])
        that returns a dict of tensors with at least "actions" (env actions [B, ...]), computed as `policy(False,
        ...)` computes them, and needs nothing outside the module.

        Raises:
            NotImplementedError: the algorithm gives none (`rlfleet export` then says so).
        """
        raise NotImplementedError(f"algorithm {self.algo} gives no serving_module() for rlfleet export.")

    def status_extras(self) -> dict:
        """The algorithm's own status values {name: int or float} (status `algorithm_values` and metrics.jsonl as
        doubles, summary.json as given; e.g. kl_beta), plus optionally "phase": a string that replaces the status phase
        while training (QDagger: offline_pretraining, online)."""
        return {}

    def on_resume(self, env_steps: int) -> None:
        """Called after a checkpoint restore with the run's env steps so far (schedules that depend on them)."""

    def on_start(self) -> None:
        """Called once the service is up, before the first sample (may take time: it is not blocking startup)."""

    def ready_for_actors(self) -> bool:
        """False while actors must not collect yet (QDagger's offline phase): weights are not published."""
        return True

    def on_evaluation(self, returns: list[float], env_steps: int) -> None:
        """Called with the returns of each evaluation of the current policy."""


class AlgorithmBuilder(abc.ABC, Generic[C]):
    """One algorithm: what each rlfleet process needs of it (Acme's builder pattern), typed by its settings
    dataclass `C` (`class PPO(AlgorithmBuilder["PPOConfig"])`).

    Class attributes:
        name: the `--algo` value (one lower-case word).
        summary: one line for `--help` and error messages.
        action_space: "continuous" (gymnasium Box) or "discrete" (Discrete): envs of the other kind are refused
            before anything starts.
        uses_teacher: the run learns from a teacher run directory (`--teacher`, recorded as `RunSettings.teacher`),
            which `check_teacher` must check; what it reads of the teacher's replay it names in `replay_sources`.
        keeps_replay: the replay tables are checkpointed in the run directory (`RUN/replay`), restored on
            --resume, and written when the run finishes (so the run can be a teacher).
        unused_settings: settings of the config class (inherited) that this algorithm ignores: giving one is an
            error, with `unused_reason` as the explanation.
        status_values: {key: (label, format)} for the agent's status extras (`Agent.status_extras`) in
            `rlfleet status`, in this order (others follow under their key, 3 significant digits).
        progress_values: {key: (label, format)} for status extras shown in `rlfleet up`'s progress rows.
    """

    name: ClassVar[str]
    summary: ClassVar[str]
    action_space: ClassVar[str]
    uses_teacher: ClassVar[bool] = False
    keeps_replay: ClassVar[bool] = False
    unused_settings: ClassVar[frozenset] = frozenset()
    unused_reason: ClassVar[str] = ""
    status_values: ClassVar[dict] = {}
    progress_values: ClassVar[dict] = {}

    @abc.abstractmethod
    def config_class(self) -> type[C]:
        """The settings dataclass (see the module doc for what it must hold)."""

    @abc.abstractmethod
    def presets(self) -> dict[str, dict[str, Any]]:
        """{preset name: {setting: value}}, with a "default" preset; `--config` chooses one."""

    def env_overrides(self) -> dict[tuple[str, str], dict[str, Any]]:
        """{(preset, env id): {setting: value}} applied on top of a preset for one env ("ALE/*" matches every
        Atari id); a comment beside each should say why it is needed."""
        return {}

    def check_config(self, config: C, env_id: str) -> None:
        """Checks settings against the env before anything starts (`build_config` calls it); the default checks
        nothing.

        Raises:
            ValueError: naming the setting, why it does not fit `env_id` and the fix.
        """

    @abc.abstractmethod
    def make_tables(self, spec: EnvSpec, config: C, queue_items: int | None) -> list[reverb.Table]:
        """The replay server's tables, signatures included. `queue_items`: `rlfleet replay --queue-items`
        (None: the algorithm's own size).

        Raises:
            ValueError: sizes the tables cannot have.
        """

    @abc.abstractmethod
    def behaviour(self, actor: ActorContext) -> Behaviour:
        """The actors' behaviour policy: a function `act(policy, obs, rng)` of the latest weights (`policy`: a
        `rlfleet.actors.actor.Policy`: version, arrays, exploration), one batch step's observations `obs` [B, ...]
        and the actor's numpy `rng`, returning a `rlfleet.actors.adders.Act` (the env's action, the action as the
        items record it, extra columns); it checks its own output with `actor.check_policy_output`. `actor` is
        the `ActorContext` (`rlfleet.actors.writers`); one function serves the actor's whole collection."""

    @abc.abstractmethod
    def adder(self, actor: ActorContext, weights: WeightsView, epoch: int) -> Adder:
        """The actors' replay writer: one of `rlfleet.actors.adders`' adders (`SequenceAdder`, `WindowAdder`)
        set up for the run, which owns the item layout that `make_tables`' signature declares
        (`sequence_signature`, `window_signature`). `rlfleet.actors.adders.collect` runs the loop that feeds it;
        `weights` (the actor's weights subscription) and `epoch` are as `rlfleet.actors.writers` describes them."""

    def replay_sources(self, settings: RunSettings) -> list[ReplaySource]:
        """The replays besides the run's own that a run of `settings` learns from (`ReplaySource`s without an
        address; default: none). `rlfleet up` starts a read-only replay server for each and gives the learner
        their addresses; a learner that is not given one of them refuses to start."""
        return []

    @abc.abstractmethod
    def make_agent(
        self, spec: EnvSpec, config: C, seed: int, total_steps: int, sources: tuple[ReplaySource, ...] = ()
    ) -> Agent:
        """The learner side: update rule, weights for actors, evaluation, status extras.

        Args:
            spec: the env's spaces; config: an instance of `config_class()`; seed: the run's seed;
            total_steps: the run's env-step budget (0: none); sources: the run's `replay_sources`, each with the
                address it is served at (the learner gives every one, so an algorithm always gets those it
                asked for).
        """

    def make_policy_agent(self, spec: EnvSpec, config: C, seed: int) -> Agent:
        """An agent that only acts, for `rlfleet eval` and `rlfleet export`: a run's checkpoint is restored into
        its `checkpoint_items()` (which must be among the run's), then it gives `policy()` and
        `export_weights()`; it never trains. The default is `make_agent` with no teacher and no budget."""
        return self.make_agent(spec, config, seed, 0)

    def check_teacher(self, directory: str, spec: EnvSpec, config: C | None = None) -> dict:
        """Checks that the run directory `directory` can teach this algorithm on `spec` (with the run's settings
        `config`, where known); returns its run.json.

        Raises:
            ValueError: it cannot (the message says why and what to give instead).
        """
        raise ValueError(f"--teacher is for algorithms that learn from a teacher; {self.name} does not.")

    def import_teacher(self, model: str, env_id: str, out: str, **settings) -> dict:
        """Makes the folder `out` a teacher of this algorithm from a model trained elsewhere (`rlfleet
        import-teacher`; `settings`: where its data comes from, as the algorithm documents); returns the folder's
        run.json record.

        Raises:
            ValueError: the model, its data or the env cannot make a teacher (the message says why and what to
                give instead), or this algorithm takes no teacher.
        """
        raise ValueError(f"{self.name} learns from no teacher; import a teacher for an algorithm that does.")
