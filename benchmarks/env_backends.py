"""Env backends side by side: env steps/s of each backend and of `auto` (chosen by measurement on the actor), for
envs envpool has and envs it does not (a MuJoCo env given --env-kwargs, users' own pure-Python envs with a cheap
and an expensive step), against the raw stepping of the same env in one process, all in one run.

For each workload and each backend (`--backends`; "auto" is the actor's own choice):
1. raw: random actions, no policy, no replay, `--num-envs` envs as one batch (`rlfleet.envs.core`), against one
   env stepped alone in this process (`single_env`);
2. collection: real `rlfleet replay`, `learner` and `actor` processes on loopback (PPO, the learner never trains:
   `benchmarks/throughput.py collection_rate`): env steps/s written into Reverb;
3. with `--train-steps N`: `rlfleet up --algo ppo` for N env steps on the backend, env steps/s over the whole run
   (updates included).
Each backend is measured `--repeats` times, in a new shuffled order each time; the report gives each backend's
median rate, `auto`'s choices and its median as a fraction of the fastest backend's, and the fastest as a
multiple of the single-env rate.

Workloads: cheetah (HalfCheetah-v5: envpool has it), cheetah-kwargs (the same env given --env-kwargs
ctrl_cost_weight=0.1, its default value: no envpool), pointmass (a pure-Python env, microsecond steps) and
pointmass-1ms (the same with a 1 ms CPU-bound step) from `benchmarks/python_envs.py`.

With `--layouts 1x8 1x16 2x8`, each workload is also collected with `auto` by A actor processes of B envs each
(AxB), to show how one machine's cores are best spent.

Usage:
    python benchmarks/env_backends.py --workloads cheetah cheetah-kwargs pointmass pointmass-1ms --seconds 15 \
        --out results.json
    python benchmarks/env_backends.py --workloads cheetah pointmass-1ms --backends auto --layouts 1x8 1x16 2x8
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
# Child processes (replay, learner, actors and their env workers) import python_envs from here, as they would a
# user's installed package.
os.environ["PYTHONPATH"] = HERE + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")
sys.path.insert(0, HERE)

import python_envs  # noqa: E402,F401 - registers PointMass-v0 here too
from throughput import collection_rate, raw_steps_per_second, single_env_rate  # noqa: E402

from rlfleet.actors.backend_choice import choose_backend  # noqa: E402
from rlfleet.common.files import atomic_write  # noqa: E402
from rlfleet.envs.core import EnvError, env_with_kwargs, make_batched_env  # noqa: E402

WORKLOADS = {
    "cheetah": "HalfCheetah-v5",
    "cheetah-kwargs": env_with_kwargs("HalfCheetah-v5", {"ctrl_cost_weight": 0.1}),
    "pointmass": "python_envs:PointMass-v0",
    "pointmass-1ms": env_with_kwargs("python_envs:PointMass-v0", {"busy_seconds": 0.001}),
}
BACKENDS = ("auto", "sync", "workers", "envpool", "async")


def raw_rate(env_id: str, num_envs: int, backend: str, seconds: float) -> tuple[float, dict]:
    """Raw env steps/s of `num_envs` envs on `backend` in this process ("auto": the backend `choose_backend`
    picks here, with its choice under "choice" and "reason" of the second value)."""
    if backend == "auto":
        venv, choice = choose_backend(env_id, num_envs)
        chosen = dict(choice=choice.backend, reason=choice.reason)
    else:
        venv, chosen = make_batched_env(env_id, num_envs, backend), {}
    try:
        return raw_steps_per_second(venv, seconds), chosen
    finally:
        venv.close()


def train_rate(env_id: str, num_envs: int, backend: str, steps: int) -> float:
    """Env steps/s of `rlfleet up --algo ppo` for `steps` env steps on `backend` (the learner's wall-clock)."""
    with tempfile.TemporaryDirectory(prefix="rlfleet-backends-") as tmp:
        logdir = os.path.join(tmp, "run")
        cmd = [sys.executable, "-m", "rlfleet.deploy.cli", "up", "--algo", "ppo", "--env", env_id,
               "--total-steps", str(steps), "--set", f"envs_per_actor={num_envs}", "--env-backend", backend,
               "--logdir", logdir]  # fmt: skip
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
        with open(os.path.join(logdir, "summary.json")) as f:
            summary = json.load(f)
    return summary["env_steps"] / summary["wall_seconds"]


def measure(name: str, num_envs: int, backends: list[str], seconds: float, train_steps: int, repeats: int) -> dict:
    """Every measurement of one workload (module doc), `repeats` times, the backends in a new shuffled order each
    time (so that the machine's load falls on all of them alike); the rates are the medians of the repeats."""
    env_id = WORKLOADS[name]
    out = dict(workload=name, env_id=env_id, num_envs=num_envs, single_env=single_env_rate(env_id, seconds / 2))
    samples = {key: {} for key in ("raw", "collection", "train")}
    choices = []  # auto's choice when timed alone in this process (raw stepping)
    collection_choices = []  # the backend each real actor on auto took in the collection runs
    usable = []
    for backend in backends:  # which backends can step this env at all
        try:
            if backend != "auto":
                make_batched_env(env_id, 1, backend).close()
            usable.append(backend)
        except EnvError as e:
            print(f"  {name}: {backend} cannot step it ({e})", flush=True)
    order = random.Random(name)
    for repeat in range(repeats):
        for backend in order.sample(usable, len(usable)):
            rate, chosen = raw_rate(env_id, num_envs, backend, seconds / 2)
            samples["raw"].setdefault(backend, []).append(rate)
            if chosen:
                choices.append(chosen)
            collected = collection_rate(env_id, num_envs, backend, 1, seconds, warmup=5)
            samples["collection"].setdefault(backend, []).append(collected["written_env_steps_per_second"])
            if backend == "auto":
                collection_choices.append(collected["env_backends"])
            if train_steps:
                samples["train"].setdefault(backend, []).append(train_rate(env_id, num_envs, backend, train_steps))
            line = "  ".join(f"{key} {v[backend][-1]:>9,.0f}" for key, v in samples.items() if backend in v)
            print(f"  {name} #{repeat} {backend:<8} {line} env steps/s", flush=True)
    out.update(samples=samples, auto_in_process=choices, auto_in_collection=collection_choices)
    for key, per_backend in samples.items():
        rates = {b: statistics.median(v) for b, v in per_backend.items()}
        out[key] = rates
        named = {b: r for b, r in rates.items() if b != "auto"}
        if "auto" in rates and named:
            fastest = max(named, key=named.get)
            out[f"{key}_auto_fraction_of_fastest"] = rates["auto"] / named[fastest]
            out[f"{key}_fastest"] = fastest
            out[f"{key}_fastest_over_single_env"] = named[fastest] / out["single_env"]
    return out


def measure_layouts(name: str, layouts: list[str], seconds: float, repeats: int) -> dict:
    """Collection env steps/s with `auto` for each layout "AxB" (A actor processes of B envs each, all on this
    machine), `repeats` times in a new shuffled order each time: ({layout: [rates]}, {layout: [[the backend each
    actor took]]}). How a machine's cores are best spent: more envs per actor, or more actors."""
    env_id, rates, chosen = WORKLOADS[name], {}, {}
    order = random.Random(f"{name} layouts")
    for repeat in range(repeats):
        for layout in order.sample(layouts, len(layouts)):
            actors, envs = (int(x) for x in layout.split("x"))
            r = collection_rate(env_id, envs, "auto", actors, seconds, warmup=5)
            rates.setdefault(layout, []).append(r["written_env_steps_per_second"])
            chosen[layout] = chosen.get(layout, []) + [r["env_backends"]]
            print(
                f"  {name} #{repeat} {layout:<6} collection {rates[layout][-1]:>9,.0f} env steps/s "
                f"(actors on {', '.join(r['env_backends'])})",
                flush=True,
            )
    return rates, chosen


def _layout(text: str) -> str:
    """argparse type of --layouts: "AxB" with A actors and B envs per actor, both at least 1."""
    actors, _, envs = text.partition("x")
    if not (actors.isdigit() and envs.isdigit() and int(actors) >= 1 and int(envs) >= 1):
        raise argparse.ArgumentTypeError(f"{text!r} is not ACTORSxENVS, e.g. 2x8 for 2 actors of 8 envs each")
    return text


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    p.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    p.add_argument("--num-envs", type=int, default=8, help="envs per actor (one batch)")
    p.add_argument("--seconds", type=float, default=15.0, help="each collection window (raw: half of it)")
    p.add_argument("--train-steps", type=int, default=0, help="also train PPO this many env steps per backend")
    p.add_argument("--repeats", type=int, default=3, help="measurements of each backend (medians reported)")
    p.add_argument(
        "--layouts", nargs="*", type=_layout, default=[],
        help="also collect with auto in these layouts, ACTORSxENVS each (e.g. 1x8 1x16 2x8)",
    )  # fmt: skip
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args()
    results = []
    for name in args.workloads:
        print(f"{name}: {WORKLOADS[name]}", flush=True)
        r = measure(name, args.num_envs, args.backends, args.seconds, args.train_steps, args.repeats)
        results.append(r)
        for key in ("raw", "collection", "train"):
            if f"{key}_fastest" in r:
                print(
                    f"  {key}: auto {r[key]['auto']:,.0f} = {100 * r[f'{key}_auto_fraction_of_fastest']:.0f}% of the "
                    f"fastest ({r[f'{key}_fastest']}); fastest = {r[f'{key}_fastest_over_single_env']:.2f}x one env "
                    f"alone ({r['single_env']:,.0f}/s)",
                    flush=True,
                )
        for chosen in r["auto_in_process"]:
            print(f"  auto here: {chosen['reason']}", flush=True)
        for chosen in r["auto_in_collection"]:
            print(f"  auto in the collection runs' actor: {', '.join(chosen)}", flush=True)
        if args.layouts:
            r["layouts"], r["layout_backends"] = measure_layouts(name, args.layouts, args.seconds, args.repeats)
            for layout, rates in r["layouts"].items():
                print(f"  layout {layout}: median {statistics.median(rates):,.0f} env steps/s", flush=True)
    if args.out:
        record = dict(cores=os.cpu_count(), settings=vars(args), results=results)
        atomic_write(args.out, json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
