"""PPO per env step: rlfleet's asynchronous cluster against its synchronous control and a peer with the same details.

Variants (`VARIANTS`), each run with `benchmarks/suite.py`'s runner into OUT/VARIANT/ENV-sSEED:
- sync-cleanrl: `--config cleanrl --set synchronous=true`: the on-policy control, CleanRL's PPO details;
- async-cleanrl: the same preset with the asynchronous actors (policy lag, statistics that travel with weights);
- async-default: rlfleet's `default` preset as `rlfleet up` runs it;
- async-cleanrl-nocredit: async-cleanrl with actors that run free of the lag limit (`actor_credit=false`);
- async-default-returnscale: async-default with rewards divided by the std of the discounted return;
- async-cleanrl-lag1, async-default-lag1: actors at most one policy version ahead (`max_policy_lag=1`): the next
  batch is collected while the learner trains on the last;
- async-cleanrl-lag0, async-default-lag0: the asynchronous path held to no lag at all (`max_policy_lag=0`): each
  actor writes its share of a batch and waits for the next version, as the synchronous control does, but through
  the asynchronous code;
- sync-default: the same preset collected synchronously (what the asynchronous actors cost it);
- sb3-cleanrl: the peer, Stable-Baselines3's PPO configured to the cleanrl preset (`sb3_peer.py --preset cleanrl`);
- sb3-default: Stable-Baselines3's PPO with its own defaults;
- sb3-cleanrl-1env: the peer with CleanRL's own layout, one env of 2048 steps per update;
- sb3-cleanrl-rolloutstats: the peer with its normalisers' statistics updated once per rollout, as the control's are
  once per update;
- sb3-cleanrl-novclip: the peer without its clipped value loss (against the ablation sync-cleanrl-novclip);
- sb3-default-normobs, sb3-default-normreward: SB3's defaults with VecNormalize on observations, or on rewards;
- ablations from the control, from sync-default, async-default or async-cleanrl (`ABLATIONS`): one setting each,
  or a named group of them (sync-default-sb3), run when named with --variants.

`run` trains every (variant, env, seed) that has no finished run directory, one at a time (a stopped rlfleet run
continues with --resume). With --records each finished run leaves a record (its summary, evaluations and the
diagnostics on the grid, tens of KB: `report.save_record`) in RECORDS/VARIANT/ENV-sSEED.json, and a run with a record
of its budget is not run again, so a benchmark goes on over several sessions from its records alone. `run` ends
with the report of the envs and variants it was given (and the control, with the peer beside it); `report
--envs ... --variants ...` keeps to those too.
`report` prints, per env and variant, the final evaluation return of each seed, their
IQM with a stratified-bootstrap 95% CI (rliable) and median, the median wall-clock and env-step rate, the median
share of off-policy env steps (those trained on that an older policy version acted on; rlfleet's runs), and against
the control its IQM ratio and the probability that one of its runs beats one of the control's, with their CIs (and
the same against another variant for each pair `--against VARIANT=OTHER` names); the IQM learning curve on a grid
of `GRID` env steps with its CI band, and at how many points the control's curve lies inside, above or below the
peer's band; it writes one PNG of curves and one of training diagnostics (approx KL, clip fraction, entropy,
explained variance, value loss, policy std, the medians over seeds) per env.

Usage (`pip install -e ".[cpu,report,bench]"`; peers need the machine to themselves, see benchmarks/README.md):
    python benchmarks/ppo_control.py run --envs Hopper-v5 --seeds 0 1 2 3 4 --total-steps 300000 --out runs/ppo-control
    python benchmarks/ppo_control.py report runs/ppo-control --json benchmarks/results/ppo-control.json \
        --plots benchmarks/results
    python benchmarks/ppo_control.py run ... --records benchmarks/results/ppo-runs  # and report --records ...
"""

from __future__ import annotations

import argparse
import collections
import difflib
import glob
import json
import os
import sys
import textwrap
from collections.abc import Sequence

import numpy as np

# benchmarks/report.py (this script's folder is on sys.path)
from report import (
    MIN_COMPARED_RUNS,
    compare_with_ci,
    finished,
    iqm_with_ci,
    load_runs,
    read_record,
    record_path,
    run_name,
    save_record,
)
from suite import run_one

from rlfleet.algorithms.ppo.config import PPOConfig
from rlfleet.common.files import atomic_write

# variant -> (suite.py algo, arguments for `rlfleet up` or sb3_peer.py).
VARIANTS = {
    "sync-cleanrl": ("ppo", ["--config", "cleanrl", "--set", "synchronous=true"]),
    "async-cleanrl": ("ppo", ["--config", "cleanrl"]),
    "async-default": ("ppo", []),
    "async-cleanrl-nocredit": ("ppo", ["--config", "cleanrl", "--set", "actor_credit=false"]),
    "async-default-returnscale": ("ppo", ["--set", "reward_scale=return"]),
    "async-cleanrl-lag1": ("ppo", ["--config", "cleanrl", "--set", "max_policy_lag=1"]),
    "async-default-lag1": ("ppo", ["--set", "max_policy_lag=1"]),
    # The asynchronous path held to no lag: each actor writes one share of a batch per policy version.
    "async-default-lag0": ("ppo", ["--set", "max_policy_lag=0"]),
    "async-cleanrl-lag0": ("ppo", ["--config", "cleanrl", "--set", "max_policy_lag=0"]),
    "sync-default": ("ppo", ["--set", "synchronous=true"]),
    "sb3-cleanrl": ("sb3-ppo", ["--preset", "cleanrl"]),
    "sb3-default": ("sb3-ppo", []),
    "sb3-cleanrl-1env": ("sb3-ppo", ["--preset", "cleanrl", "--n-envs", "1"]),
    # The peer with its VecNormalize statistics merged once per rollout, as the control's learner merges them once
    # per update, rather than at every env step.
    "sb3-cleanrl-rolloutstats": ("sb3-ppo", ["--preset", "cleanrl", "--statistics", "rollout"]),
    # The peer without its clipped value loss, against sync-cleanrl-novclip: SB3 clips the value prediction and
    # keeps that loss alone, the control keeps the larger of the clipped and unclipped losses (CleanRL's).
    "sb3-cleanrl-novclip": ("sb3-ppo", ["--preset", "cleanrl", "--value-clip", "0"]),
    # SB3's defaults with its own VecNormalize: whether normalising observations, or scaling rewards by the
    # discounted return's std, costs SB3's PPO what it costs rlfleet's.
    "sb3-default-normobs": ("sb3-ppo", ["--normalize", "obs"]),
    "sb3-default-normreward": ("sb3-ppo", ["--normalize", "reward"]),
}
# Where Stable-Baselines3's PPO defaults differ from the `default` preset (its value weight aside: see `-vf1`):
# its optimisation (one Adam with ε 1e-5 over the summed loss, advantages per minibatch, orthogonal initialisation),
# raw observations and a constant learning rate.
_SB3_OPTIMISATION = [
    *("--set", "shared_optimizer=true", "--set", "adam_epsilon=1e-5"),
    *("--set", "advantage_norm=minibatch", "--set", "init=orthogonal"),
]
_SB3_DEFAULTS = [*_SB3_OPTIMISATION, "--set", "obs_normalization=false", "--set", "lr_schedule=constant"]
# `default`'s optimisation (its PPOConfig field defaults) where _SB3_OPTIMISATION and SB3's value weight differ.
_DEFAULT_OPTIMISATION = [
    arg
    for key in (*(s.split("=")[0] for s in _SB3_OPTIMISATION[1::2]), "value_loss_coef")
    for arg in ("--set", f"{key}={str(getattr(PPOConfig, key)).lower()}")
]
# name -> (the variant it starts from, the difference): which of the cleanrl preset's details, or of the default
# preset's against them or Stable-Baselines3's, costs what per env step.
ABLATIONS = {
    "sync-cleanrl-constant-lr": ("sync-cleanrl", ["--set", "lr_schedule=constant"]),
    "sync-cleanrl-noobsnorm": ("sync-cleanrl", ["--set", "obs_normalization=false"]),
    "sync-cleanrl-sb3defaults": (
        "sync-cleanrl",
        [
            *("--set", "obs_normalization=false", "--set", "reward_scale=none"),
            *("--set", "lr_schedule=constant", "--set", "value_clip=0.0"),
        ],
    ),
    "sync-cleanrl-obsclip5": ("sync-cleanrl", ["--set", "obs_clip=5.0"]),
    "sync-cleanrl-noreturnscale": ("sync-cleanrl", ["--set", "reward_scale=none"]),
    "sync-cleanrl-separate-opt": ("sync-cleanrl", ["--set", "shared_optimizer=false"]),
    "sync-cleanrl-varscale-init": ("sync-cleanrl", ["--set", "init=variance_scaling"]),
    "sync-cleanrl-batch-advnorm": ("sync-cleanrl", ["--set", "advantage_norm=batch"]),
    "sync-cleanrl-novclip": ("sync-cleanrl", ["--set", "value_clip=0.0"]),
    "sync-default-returnscale": ("sync-default", ["--set", "reward_scale=return"]),
    "sync-default-orthinit": ("sync-default", ["--set", "init=orthogonal"]),
    # One of Stable-Baselines3's PPO defaults at a time on the `default` preset, and all of them together
    # (SB3 keeps raw observations and rewards, one Adam with ε 1e-5 over policy + 0.5 × its mean-squared-error
    # value loss, advantages normalised per minibatch, orthogonal initialisation and a constant learning rate;
    # these keep rlfleet's value_loss_coef 0.5 on half that error, half SB3's weight: `-vf1` has SB3's).
    "sync-default-sharedopt": ("sync-default", ["--set", "shared_optimizer=true"]),
    "sync-default-rawobs": ("sync-default", ["--set", "obs_normalization=false"]),
    "sync-default-adameps": ("sync-default", ["--set", "adam_epsilon=1e-5"]),
    "sync-default-mbadvnorm": ("sync-default", ["--set", "advantage_norm=minibatch"]),
    "sync-default-constant-lr": ("sync-default", ["--set", "lr_schedule=constant"]),
    # The observation normaliser's clip: CleanRL's ±10, and none at all (raw observations are never clipped).
    "sync-default-obsclip10": ("sync-default", ["--set", "obs_clip=10.0"]),
    "sync-default-noobsclip": ("sync-default", ["--set", "obs_clip=1000000.0"]),
    "sync-default-sb3": ("sync-default", _SB3_DEFAULTS),
    # SB3's value loss is the mean squared error (rlfleet's is half of it), so its vf_coef 0.5 is 1.0 here; and
    # its one env of 2048 steps per update in place of 8 envs.
    "sync-default-sb3-vf1": ("sync-default-sb3", ["--set", "value_loss_coef=1.0"]),
    "sync-default-sb3-1env": ("sync-default-sb3-vf1", ["--set", "envs_per_actor=1"]),
    # The same with observations normalised as SB3's VecNormalize does by default (clip ±10): against
    # sb3-default-normobs, whether rlfleet's normaliser costs what SB3's does.
    "sync-default-sb3-1env-obsnorm": (
        "sync-default-sb3-1env",
        ["--set", "obs_normalization=true", "--set", "obs_clip=10.0"],
    ),
    # And with rewards divided by the std of the discounted return (clip ±10), against sb3-default-normreward.
    "sync-default-sb3-1env-returnscale": ("sync-default-sb3-1env", ["--set", "reward_scale=return"]),
    # Which of `default`'s settings normalised observations cost Hopper with: SB3's settings with one of
    # `default`'s back, raw and normalised (clip ±10): its annealed rate, its 8 envs per actor (raw: -sb3-vf1),
    # or its optimisation (two Adams at Keras' ε, advantages per batch, variance-scaling initialisation).
    "sync-default-sb3-1env-annealed": ("sync-default-sb3-1env", ["--set", "lr_schedule=linear"]),
    "sync-default-sb3-1env-obsnorm-annealed": ("sync-default-sb3-1env-obsnorm", ["--set", "lr_schedule=linear"]),
    "sync-default-sb3-vf1-obsnorm": (
        "sync-default-sb3-vf1",
        ["--set", "obs_normalization=true", "--set", "obs_clip=10.0"],
    ),
    "sync-default-sb3-1env-defaultopt": ("sync-default-sb3-1env", _DEFAULT_OPTIMISATION),
    "sync-default-sb3-1env-obsnorm-defaultopt": ("sync-default-sb3-1env-obsnorm", _DEFAULT_OPTIMISATION),
    # The same, collected asynchronously (as `rlfleet up` runs it).
    "async-default-sb3-1env": (
        "async-default",
        [*_SB3_DEFAULTS, "--set", "value_loss_coef=1.0", "--set", "envs_per_actor=1"],
    ),
    # SB3's settings with `default`'s annealed rate, collected asynchronously: against sync-default-sb3-1env-annealed,
    # whether the lag costs Ant-v5 with the annealed rate under other settings too.
    "async-default-sb3-1env-annealed": ("async-default-sb3-1env", ["--set", "lr_schedule=linear"]),
    # SB3's optimisation settings on `default` (one Adam, ε 1e-5, over policy + SB3's value weight, advantages per
    # minibatch, orthogonal initialisation), keeping its observations (normalised, raw on Ant-v5) and annealed rate.
    "async-default-sb3opt": ("async-default", [*_SB3_OPTIMISATION, "--set", "value_loss_coef=1.0"]),
    # With SB3's constant rate as well (SB3's settings but `default`'s observations), with 8 envs per actor and
    # with one: set against async-default-sb3-1env, which of raw observations and the layout keeps Hopper's gait.
    "async-default-sb3norm": ("async-default-sb3opt", ["--set", "lr_schedule=constant"]),
    "async-default-sb3norm-1env": ("async-default-sb3norm", ["--set", "envs_per_actor=1"]),
    "async-default-rawobs": ("async-default", ["--set", "obs_normalization=false"]),
    # `default`'s handling of lagged data, changed: no importance weights, or GAE over lagged steps weighted by
    # truncated π/π_behaviour ratios (a correction `default` does not make).
    "async-default-uncorrected": ("async-default", ["--set", "off_policy_objective=uncorrected"]),
    "async-default-traces": ("async-default", ["--set", "advantage_traces=ratio"]),
    # One env per actor in place of 8 (the batch of 2048 env steps then comes from one env, as SB3's default).
    "async-default-1env": ("async-default", ["--set", "envs_per_actor=1"]),
    "sync-default-1env": ("sync-default", ["--set", "envs_per_actor=1"]),
    # Stable-Baselines3's constant learning rate where `default` anneals it to 0 at the run's budget.
    "async-default-constant-lr": ("async-default", ["--set", "lr_schedule=constant"]),
    # The rate annealed to a floor of a quarter or half of its start in place of 0 (`lr_final_fraction`): between
    # `default`'s schedule and a constant rate.
    "async-default-lrfloor25": ("async-default", ["--set", "lr_final_fraction=0.25"]),
    "async-default-lrfloor50": ("async-default", ["--set", "lr_final_fraction=0.5"]),
    "sync-default-lrfloor25": ("sync-default", ["--set", "lr_final_fraction=0.25"]),
    # Raw rewards where `default` scales them (Swimmer-v5's per-env override).
    "async-default-rawrewards": ("async-default", ["--set", "reward_scale=none"]),
    "async-cleanrl-behaviour": ("async-cleanrl", ["--set", "off_policy_objective=behaviour"]),
    "async-cleanrl-lag1-behaviour": ("async-cleanrl-lag1", ["--set", "off_policy_objective=behaviour"]),
    "async-cleanrl-uncorrected": ("async-cleanrl", ["--set", "off_policy_objective=uncorrected"]),
    "async-cleanrl-traces": ("async-cleanrl", ["--set", "advantage_traces=ratio"]),
    # Importance weights π_proximal/π_behaviour as they are (no truncation): the decoupled objective's correction in
    # full once the policy's std is small and a few versions of lag make them large.
    "async-cleanrl-untruncated": ("async-cleanrl", ["--set", "max_importance_weight=1000000.0"]),
    # The preset with the `default` preset's item length: a batch from several items (and, with several actors, from
    # all of them) rather than one item per actor.
    "async-cleanrl-unroll64": ("async-cleanrl", ["--set", "unroll_length=64"]),
    # Updates stopped once the policy has moved an approx KL of 1.5 × 0.01 from the update's start.
    "async-cleanrl-targetkl": ("async-cleanrl", ["--set", "target_kl=0.01"]),
    "sync-cleanrl-targetkl": ("sync-cleanrl", ["--set", "target_kl=0.01"]),
    # Swimmer-v5 with the discount the `default` preset uses for it (see algorithms/ppo/config.py, ENV_OVERRIDES).
    "async-cleanrl-gamma9999": ("async-cleanrl", ["--set", "discount=0.9999"]),
}
for _name, (_base, _more) in ABLATIONS.items():
    VARIANTS[_name] = ("ppo", VARIANTS[_base][1] + _more)

GRID = 20_480  # env steps between curve points: 10 updates of 2048 env steps (rlfleet's evaluation period)
CURVE_METRICS = ("approx_kl", "clip_fraction", "entropy", "explained_variance", "value_loss", "policy_std")
PEER = "sb3-cleanrl"
MIN_PEER_SEEDS = 3  # fewer peer runs give no band to hold the control's curve against
CONTROL = "sync-cleanrl"


def evaluations(run: dict) -> list[tuple[int, float]]:
    """(env steps, evaluation return) of each evaluation of a run, its final one included. rlfleet's rows give
    the env steps at the evaluation (`eval_env_steps`); a row without them (the peer's) is placed at its own."""
    points, last = [], None
    for r in run["rows"]:
        value = r.get("eval_return_mean")
        if value is None:
            continue
        steps = r["env_steps"] if r.get("eval_env_steps") is None else r["eval_env_steps"]
        if (steps, value) != last:
            points.append((steps, value))
            last = (steps, value)
    s = run["summary"]
    if s.get("final_eval_return_mean") is not None:
        points.append((s["env_steps"], s["final_eval_return_mean"]))
    return points


def curve(run: dict, budget: int) -> list[float | None]:
    """The run's latest evaluation at each grid point GRID, 2 GRID, ... up to `budget` (None before the first);
    an evaluation up to one update (2048 env steps) past a point counts for it (an update's steps overshoot)."""
    points = evaluations(run)
    out = []
    for g in range(GRID, budget + 1, GRID):
        seen = [v for steps, v in points if steps <= g + 2048]
        out.append(seen[-1] if seen else None)
    return out


def variant_of(run_dir: str) -> str:
    """The variant of a run directory OUT/VARIANT/ENV-sSEED, or of a record RECORDS/VARIANT/ENV-sSEED.json."""
    return os.path.basename(os.path.dirname(run_dir.rstrip("/")))


def variant_record_path(records: str, logdir: str) -> str:
    """Where the record of the run directory OUT/VARIANT/ENV-sSEED goes: RECORDS/VARIANT/ENV-sSEED.json."""
    return record_path(os.path.join(records, variant_of(logdir)), logdir)


def recorded(records: str | None, logdir: str, budget: int) -> bool:
    """Whether RECORDS holds a record of the run in `logdir` that finished `budget` env steps."""
    path = variant_record_path(records, logdir) if records else None
    return bool(path and os.path.exists(path) and finished(read_record(path)["summary"], budget))


def keep_record(logdir: str, records: str, command: list[str]) -> None:
    """Writes the record of the finished run in `logdir` (summary, evaluations with their own env steps, and the
    `CURVE_METRICS` on the GRID): `report` reads the same curves, finals and diagnostics from it."""
    (run,) = load_runs([logdir])
    save_record(run, variant_record_path(records, logdir), row_fields=CURVE_METRICS, grid=GRID, command=command)


def report(
    out: str | None,
    budget: int | None = None,
    control: str = CONTROL,
    records: str | None = None,
    pairs: Sequence[tuple[str, str]] = (),
    envs: Sequence[str] | None = None,
    variants: Sequence[str] | None = None,
) -> dict:
    """Per env and variant: final returns, IQM [95% CI], median, wall-clock, env-step rate, share of off-policy
    env steps (`off_policy_fraction`), IQM curve with bands;
    each variant set against `control` (the synchronous control unless another variant is named), and each
    (variant, other) of `pairs` against that other variant as well (`against`: {other: comparison}). Reads the run
    directories OUT/VARIANT/ENV-sSEED and the records RECORDS/VARIANT/ENV-sSEED.json; a run directory stands in for
    its own record. `envs` and `variants`, where given, keep the report to those (None: all found); the variants
    kept take with them the control, the sides of `pairs` and, beside the control, the peer, so that every
    comparison the report makes stays in it."""
    paths = []
    if records:
        paths += sorted(glob.glob(os.path.join(glob.escape(records), "*", "*.json")))
    if out:
        summaries = sorted(glob.glob(os.path.join(glob.escape(out), "*", "*", "summary.json")))
        paths += [os.path.dirname(p) for p in summaries]
    found = {}  # (variant, ENV-sSEED) -> the finished run; a directory (read last) in place of its record
    for r in load_runs(paths):
        if r["summary"].get("completed", True):
            found[(variant_of(r["dir"]), run_name(r["dir"]))] = r
    runs = [found[k] for k in sorted(found)]
    shown = None if variants is None else {*variants, control, *(v for pair in pairs for v in pair)}
    if shown is not None and control == CONTROL:
        shown.add(PEER)
    groups = collections.defaultdict(list)
    for r in runs:
        env, variant = r["summary"]["env_id"], variant_of(r["dir"])
        if (envs is None or env in envs) and (shown is None or variant in shown):
            groups[(env, variant)].append(r)
    result = {}
    for (env, variant), rs in sorted(groups.items()):
        print(f"# {env} {variant}: {len(rs)} runs, bootstrapping the curve's bands", file=sys.stderr, flush=True)
        finals = [r["summary"]["final_eval_return_mean"] for r in rs]
        walls = [r["summary"]["wall_seconds"] for r in rs]
        steps = [r["summary"]["env_steps"] for r in rs]
        top = budget or min(steps)
        curves = np.array([[np.nan if v is None else v for v in curve(r, top)] for r in rs])
        bands = []
        for j in range(curves.shape[1]):
            column = curves[:, j]
            if np.isnan(column).any():
                bands.append(None)
                continue
            bands.append(iqm_with_ci(column[:, None]) if len(column) > 1 else (column[0],) * 3)
        point, low, high = iqm_with_ci(np.array(finals)[:, None]) if len(finals) > 1 else (finals[0],) * 3
        result.setdefault(env, {})[variant] = dict(
            seeds=[r["summary"].get("seed") for r in rs],
            final_returns=finals,
            final_iqm=point,
            final_iqm_ci95=[low, high],
            final_median=float(np.median(finals)),
            wall_seconds_median=float(np.median(walls)),
            env_steps_per_second_median=float(np.median([s / w for s, w in zip(steps, walls)])),
            off_policy_fraction_median=off_policy_fraction(rs),
            curve_env_steps=list(range(GRID, top + 1, GRID)),
            curve_iqm=[None if b is None else b[0] for b in bands],
            curve_ci95=[None if b is None else [b[1], b[2]] for b in bands],
            diagnostics=diagnostics(rs),
            dirs=[r["dir"] for r in rs],
        )
    for variants in result.values():
        base = variants.get(control)
        if base and len(base["final_returns"]) >= MIN_COMPARED_RUNS:
            for name, v in variants.items():
                if name != control and len(v["final_returns"]) >= MIN_COMPARED_RUNS:
                    v["against_control"] = dict(
                        compare_with_ci(v["final_returns"], base["final_returns"]), control=control
                    )
        for name, other in pairs:
            v, w = variants.get(name), variants.get(other)
            if v and w and min(len(v["final_returns"]), len(w["final_returns"])) >= MIN_COMPARED_RUNS:
                v.setdefault("against", {})[other] = compare_with_ci(v["final_returns"], w["final_returns"])
        if control == CONTROL and base and PEER in variants and len(variants[PEER]["final_returns"]) >= MIN_PEER_SEEDS:
            peer = variants[PEER]
            points = [(c, p) for c, p in zip(base["curve_iqm"], peer["curve_ci95"]) if c is not None and p]
            base["inside_peer_band"] = [sum(p[0] <= c <= p[1] for c, p in points), len(points)]
            base["above_peer_band"] = sum(c > p[1] for c, p in points)
            base["below_peer_band"] = sum(c < p[0] for c, p in points)
    return result


def diagnostics(runs: list[dict]) -> dict:
    """{metric: [(env steps, median over the runs)]} on the GRID (each run's latest row at or before a point)."""
    out = {}
    top = min(r["summary"]["env_steps"] for r in runs)
    for name in CURVE_METRICS:
        series = []
        for g in range(GRID, top + 1, GRID):
            values = []
            for r in runs:
                seen = [row[name] for row in r["rows"] if row["env_steps"] <= g and row.get(name) is not None]
                if seen:
                    values.append(seen[-1])
            if values:
                series.append((g, float(np.median(values))))
        out[name] = series
    return out


def plot(result: dict, folder: str) -> list[str]:
    """One PNG of IQM curves with 95% CI bands and one of diagnostics per env; returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(folder, exist_ok=True)
    paths = []
    for env, variants in result.items():
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for variant, v in sorted(variants.items()):
            xs = [x for x, y in zip(v["curve_env_steps"], v["curve_iqm"]) if y is not None]
            ys = [y for y in v["curve_iqm"] if y is not None]
            lows = [c[0] for c in v["curve_ci95"] if c is not None]
            highs = [c[1] for c in v["curve_ci95"] if c is not None]
            (line,) = ax.plot(xs, ys, label=f"{variant} ({len(v['final_returns'])} seeds)")
            ax.fill_between(xs, lows, highs, color=line.get_color(), alpha=0.15)
        ax.set(xlabel="env steps", ylabel="evaluation return (IQM, 95% CI)", title=env)
        ax.legend(fontsize=7)
        path = os.path.join(folder, f"ppo-control-{env}.png")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
        fig, axes = plt.subplots(2, 3, figsize=(12, 6.5))
        for ax, name in zip(axes.flat, CURVE_METRICS):
            for variant, v in sorted(variants.items()):
                pts = v["diagnostics"].get(name) or []
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], label=variant)
            ax.set(title=name, xlabel="env steps")
        axes.flat[0].legend(fontsize=6)
        fig.suptitle(f"{env}: training diagnostics (median over seeds)")
        fig.tight_layout()
        path = os.path.join(folder, f"ppo-control-{env}-diagnostics.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def _return(x: float) -> str:
    """A return for the printed report: whole numbers from 100 up, three significant digits below (−4.12)."""
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"


def off_policy_fraction(runs: Sequence[dict]) -> float | None:
    """The median over `runs` of the share of the env steps trained on that an older policy version acted on
    (summary.json's off_policy_env_steps ÷ consumed_env_steps, rlfleet's PPO); None if any run has no such count
    (the peer's, or a record older than the count) or trained on nothing. The learner counts off-policy env steps
    per process, so a resumed run's share counts only its last process's off-policy steps: an underestimate."""
    shares = []
    for r in runs:
        off, consumed = r["summary"].get("off_policy_env_steps"), r["summary"].get("consumed_env_steps")
        if off is None or not consumed:
            return None
        shares.append(off / consumed)
    return float(np.median(shares)) if shares else None


def print_report(result: dict, pairs: Sequence[tuple[str, str]] = ()) -> None:
    """Prints `report`'s result per env: each variant's finals, IQM [95% CI], median, wall-clock, env-step rate and
    share of off-policy env steps (where its runs count them),
    its comparisons (the control's and those of `pairs`) and the control's place against the peer's band; then each
    pair of `pairs` compared on no env (one side missing, or fewer than MIN_COMPARED_RUNS runs)."""
    width = max([28, *(len(v) for variants in result.values() for v in variants)])
    for env, variants in result.items():
        print(f"\n{env}")
        head = f"  {'variant':{width}s} {'final returns':40s} {'IQM [95% CI]':26s}"
        print(f"{head} {'median':>8s} {'wall s':>7s} {'steps/s':>8s} {'off-policy':>10s}")
        for variant, v in sorted(variants.items(), key=lambda kv: -kv[1]["final_iqm"]):
            finals = ", ".join(_return(x) for x in v["final_returns"])
            ci = f"{_return(v['final_iqm'])} [{_return(v['final_iqm_ci95'][0])}, {_return(v['final_iqm_ci95'][1])}]"
            off = v.get("off_policy_fraction_median")
            print(
                f"  {variant:{width}s} {finals:40s} {ci:26s} {_return(v['final_median']):>8s} "
                f"{v['wall_seconds_median']:7.0f} {v['env_steps_per_second_median']:8.0f}"
                + ("" if off is None else f" {off:10.2f}")
            )
            compared = {v["against_control"]["control"]: v["against_control"]} if "against_control" in v else {}
            for base, c in {**compared, **v.get("against", {})}.items():
                ratio = c["iqm_ratio"]
                said = f"IQM ÷ {base}'s {ratio[0]:.2f} [{ratio[1]:.2f}, {ratio[2]:.2f}], " if ratio else ""
                p_x = c["probability_of_improvement"]
                print(f"  {'':{width}s} {said}P(a run beats one of {base}) {p_x[0]:.2f} [{p_x[1]:.2f}, {p_x[2]:.2f}]")
            if "inside_peer_band" in v:
                inside, total = v["inside_peer_band"]
                print(
                    f"  {'':{width}s} IQM curve inside {PEER}'s 95% band at {inside} of {total} points, above it at "
                    f"{v['above_peer_band']}, below it at {v['below_peer_band']}"
                )
    for name, other in dict.fromkeys(pairs):
        if not any(other in variants.get(name, {}).get("against", {}) for variants in result.values()):
            print(
                f"\n--against {name}={other}: compared on no env (each needs {MIN_COMPARED_RUNS} runs or more of "
                "both on the same env)"
            )


def _pair(text: str) -> tuple[str, str]:
    """VARIANT=OTHER of `--against`: two different known variants.

    Raises:
        argparse.ArgumentTypeError: no "=", an empty or unknown side (naming the closest variants), or a variant
            paired with itself.
    """
    name, sep, other = text.partition("=")
    example = "e.g. sync-default-sb3-vf1-obsnorm=sync-default-sb3-vf1"
    if not sep or not name or not other:
        raise argparse.ArgumentTypeError(f"{text!r} is not VARIANT=OTHER: name two variants, {example}")
    for v in (name, other):
        if v not in VARIANTS:
            close = difflib.get_close_matches(v, VARIANTS, n=3)
            hint = f"did you mean {', '.join(close)}?" if close else "`run --help` lists the variants"
            raise argparse.ArgumentTypeError(f"{text!r}: {v!r} is not a variant; {hint}")
    if name == other:
        raise argparse.ArgumentTypeError(f"{text!r} pairs {name} with itself: name another variant, {example}")
    return name, other


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    listed = "variants:\n" + textwrap.fill(
        " ".join(VARIANTS), 100, initial_indent="  ", subsequent_indent="  ", break_on_hyphens=False
    )
    r = sub.add_parser(
        "run",
        help="train the missing runs, then print the report of those envs and variants",
        epilog=listed,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    r.add_argument("--envs", nargs="+", required=True, help="gymnasium env ids, e.g. Hopper-v5")
    r.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="seeds per (variant, env)")
    r.add_argument("--total-steps", type=int, required=True, help="env steps per run")
    r.add_argument(
        "--variants",
        nargs="+",
        default=list(VARIANTS)[:6],
        choices=list(VARIANTS),
        metavar="VARIANT",
        help=f"variants to run, listed below (default: {' '.join(list(VARIANTS)[:6])})",
    )
    r.add_argument("--out", required=True, help="folder of VARIANT/ENV-sSEED run directories")
    r.add_argument(
        "--peer-threads",
        type=int,
        default=0,
        help="OMP_NUM_THREADS for the peer's torch (0: its default); 1 keeps it from spinning when another "
        "process shares the cores",
    )
    rep = sub.add_parser(
        "report",
        help="print the report of the runs under a folder, or of their records",
        epilog=listed,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    rep.add_argument(
        "out", nargs="?", default=None, help="folder of VARIANT/ENV-sSEED run directories (as `run --out` wrote it)"
    )
    rep.add_argument("--budget", type=int, default=None, help="env steps the curves go to (default: shortest run)")
    rep.add_argument("--envs", nargs="+", default=None, help="report only these env ids (default: every one found)")
    rep.add_argument(
        "--variants",
        nargs="+",
        default=None,
        choices=list(VARIANTS),
        metavar="VARIANT",
        help="report only these variants (listed below), with the control, the peer beside it and the sides of "
        "--against (default: every one found)",
    )
    for q in (r, rep):
        q.add_argument(
            "--control",
            default=CONTROL,
            choices=list(VARIANTS),
            metavar="VARIANT",
            help=f"the variant every other one is set against (default: {CONTROL}, the synchronous control)",
        )
        q.add_argument(
            "--records",
            default=None,
            help="folder of run records (VARIANT/ENV-sSEED.json, tens of KB each): `run` writes one per finished run "
            "and does not run again one recorded at its budget; the report reads them beside the run directories",
        )
        q.add_argument(
            "--against",
            nargs="+",
            default=[],
            type=_pair,
            metavar="VARIANT=OTHER",
            help="set VARIANT against OTHER as well as against the control (e.g. a setting with and without "
            "normalised observations)",
        )
        q.add_argument("--json", default=None, help="write the report as JSON here")
        q.add_argument("--plots", default=None, help="write the PNGs into this folder")
    args = p.parse_args()
    if not (args.out or args.records):
        p.error("report needs a folder of run directories or --records (a folder of run records)")
    if args.cmd == "report":
        for what, folder in (("the folder of run directories", args.out), ("--records", args.records)):
            if folder is not None and not os.path.isdir(folder):
                p.error(f"{what} {folder!r} is not a folder")
    if args.cmd == "run":
        for seed in args.seeds:  # seeds outermost: an interrupted run leaves every variant with as many seeds
            for env in args.envs:
                for variant in args.variants:
                    algo, extra = VARIANTS[variant]
                    logdir = os.path.join(args.out, variant, f"{env.replace('/', '-')}-s{seed}")  # ALE/Pong-v5
                    if recorded(args.records, logdir, args.total_steps):
                        kept = variant_record_path(args.records, logdir)
                        print(f"# {logdir}: finished earlier, kept in {kept}", flush=True)
                        continue
                    if algo.startswith("sb3-"):
                        extra = [*extra, "--eval-every", str(GRID)]
                    threads = os.environ.get("OMP_NUM_THREADS")
                    if algo.startswith("sb3-") and args.peer_threads:
                        os.environ["OMP_NUM_THREADS"] = str(args.peer_threads)
                    try:
                        run_one(algo, env, seed, args.total_steps, logdir, extra)
                    finally:
                        os.environ.pop("OMP_NUM_THREADS", None)
                        if threads is not None:
                            os.environ["OMP_NUM_THREADS"] = threads
                    if args.records:
                        command = ["--variants", variant, "--envs", env, "--seeds", str(seed)]
                        keep_record(logdir, args.records, ["run", *command, "--total-steps", str(args.total_steps)])
    result = report(
        args.out, getattr(args, "budget", None), args.control, args.records, args.against, args.envs, args.variants
    )
    if not result:
        where = " and ".join(repr(f) for f in (args.out, args.records) if f)
        p.exit(
            1,
            f"no finished runs in {where}"
            + (" of the envs and variants named" if args.envs or args.variants else "")
            + ": it reads VARIANT/ENV-sSEED run directories (as `run --out` writes them) and, with --records, "
            "VARIANT/ENV-sSEED.json records\n",
        )
    print_report(result, args.against)
    missing = [env for env in args.envs or () if env not in result]
    missing += [v for v in args.variants or () if not any(v in variants for variants in result.values())]
    if missing:
        print(f"\nno finished runs of {', '.join(missing)} (check the names)", file=sys.stderr)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        atomic_write(args.json, json.dumps(result, indent=1))
    if args.plots:
        print("\n".join(plot(result, args.plots)))


if __name__ == "__main__":
    main()
