"""rlfleet's DQN against single-process DQN on one machine (Stable-Baselines3's, and CleanRL's `dqn.py`), end to
end: wall-clock to the budget and to a return threshold, and the final return, over several seeds.

`run` trains every (system, seed) of one batch that has no finished run directory yet, one at a time, in an
order shuffled once (`--order-seed`), so that the machine's load falls on every system alike: rlfleet with
`rlfleet up` (replay, learner and one actor as local processes, the `default` preset), SB3 with
`benchmarks/sb3_peer.py --algo dqn` (SB3 2.9.2's DQN with the same preset wherever SB3 has the setting,
evaluated on the preset's evaluation schedule), and, given `--cleanrl-python` and `--cleanrl-dir`, CleanRL's
own `cleanrl/dqn.py` from a checkout, unchanged, with the preset's values for the flags it has
(`cleanrl_flags`). Each run's whole process is timed (start-up of every process included), and the CPU seconds
of all its processes counted, into RUN/process.json. `report` prints and writes, per system: the final
evaluation return (10 episodes), the whole process's wall-clock to the budget and its CPU seconds, the training
wall-clock to the threshold (the first evaluation at or above it, each system's own training clock without the time its
evaluations took: rlfleet's learner from its start, less its `evaluation_seconds`; CleanRL evaluates only once,
at the end, so it has none), each as the median and IQM over seeds with stratified-bootstrap 95% CIs (rliable), and
rlfleet's medians as a fraction of each peer's.

CleanRL's `dqn.py` reads the vector env's `final_observation`, which gymnasium 1.x no longer gives, so it runs
in an environment of its own (Python 3.11 works):
    git clone https://github.com/vwxyzjn/cleanrl /tmp/cleanrl
    python3.11 -m venv /tmp/cleanrl-venv
    /tmp/cleanrl-venv/bin/pip install "gymnasium==0.29.1" "numpy<2" "torch==2.13.0" tyro tensorboard \
        "moviepy==1.0.3" pygame   # its evaluation films episodes

Usage (with `pip install -e ".[cpu,report,bench]"`):
    python benchmarks/dqn_peer.py run --env CartPole-v1 --seeds 0 1 2 3 4 --total-steps 50000 --out runs/dqn-peer \
        --cleanrl-python /tmp/cleanrl-venv/bin/python --cleanrl-dir /tmp/cleanrl
    python benchmarks/dqn_peer.py report runs/dqn-peer --env CartPole-v1 --threshold 475 --json results.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import shlex
import signal
import statistics
import subprocess
import time

from report import finished, load_runs  # benchmarks/report.py (this script's folder is on sys.path)
from suite import interval_estimates, run_one

from rlfleet.algorithms.settings import make_algo_config
from rlfleet.common.files import atomic_write

SYSTEMS = ("dqn", "sb3-dqn")
CLEANRL = "cleanrl-dqn"  # the third system, when `run` is given a CleanRL checkout
# CleanRL's dqn.py prints these: the line after training, and one per episode of its evaluation at the end.
CLEANRL_TRAINED = re.compile(r"^model saved to ")
CLEANRL_EVAL = re.compile(r"^eval_episode=\d+, episodic_return=\[?\s*([-+0-9.eE]+)")


def preset_eval_every(env: str) -> int:
    """Env steps between two evaluations of rlfleet's `default` DQN preset for `env` (weights versions between
    evaluations × learner steps per version × env steps per learner step): SB3's evaluation schedule here."""
    c = make_algo_config("dqn", "default", env, {})
    return round(c.eval_every_updates * c.publish_every * c.batch_size / c.samples_per_insert)


def cleanrl_flags(env: str, total_steps: int) -> list[str]:
    """CleanRL `dqn.py` flags with rlfleet's `default` DQN preset for `env` wherever the script has the setting:
    learning rate (constant: the script has no schedule), replay size, warm-up, batch, γ, ε schedule, one gradient
    step every `train_frequency` env steps (the preset's replay ratio) and the target period in env steps. Its
    network (120-84), one-step single-Q targets and MSE loss are fixed in the script. Its evaluation after
    training (`--save-model`: 10 episodes at ε = end_e, a few of them filmed) gives the final return.

    Raises:
        ValueError: the preset makes a fractional number of env steps per gradient step, which the script cannot.
    """
    c = make_algo_config("dqn", "default", env, {})
    per_step = c.batch_size / c.samples_per_insert
    if per_step < 1 or per_step != int(per_step):
        raise ValueError(
            f"{env}'s preset makes {per_step:g} env steps per gradient step; CleanRL's dqn.py trains once every "
            "whole number of env steps. Compare on an env whose preset has batch_size a multiple of "
            "samples_per_insert."
        )
    values = dict(
        env_id=env,
        total_timesteps=total_steps,
        learning_rate=c.learning_rate,
        buffer_size=c.replay_size,
        gamma=c.discount,
        target_network_frequency=round(c.target_update_period * per_step),
        batch_size=c.batch_size,
        start_e=c.epsilon_start,
        end_e=c.epsilon_end,
        exploration_fraction=min(1.0, c.epsilon_decay_env_steps / total_steps),
        learning_starts=c.min_replay_size,
        train_frequency=int(per_step),
    )
    flags = [x for k, v in values.items() for x in (f"--{k.replace('_', '-')}", str(v))]
    return flags + ["--save-model", "--no-cuda", "--no-capture-video", "--no-track"]


def run_cleanrl(python: str, checkout: str, env: str, seed: int, total_steps: int, logdir: str) -> dict:
    """Runs CleanRL's `dqn.py` from `checkout` with `python` (in `logdir`, its output into
    `logdir`/cleanrl.log) and writes `logdir`/process.json: the whole process's wall-clock and CPU seconds from
    its start to its exit (`process_wall_seconds`, `cpu_seconds`: the same clock as the other systems', whose
    final evaluations and exits count too; CleanRL's evaluation also films a few episodes), the same up to the
    end of its training (its line "model saved to": `trained_wall_seconds`, `trained_cpu_seconds`), and its
    final evaluation's returns. Returns that record.

    Raises:
        SystemExit: the script failed, or printed no evaluation (its log says why).
    """
    import psutil

    script = os.path.join(checkout, "cleanrl", "dqn.py")
    if not os.path.isfile(script):
        raise SystemExit(f"--cleanrl-dir {checkout!r} holds no cleanrl/dqn.py: give a checkout of CleanRL.")
    os.makedirs(logdir, exist_ok=True)
    cmd = [python, script, "--seed", str(seed), *cleanrl_flags(env, total_steps)]
    # Its cleanrl_utils on the path; its lines unbuffered, so that the end of training is timed when it happens.
    env_vars = dict(os.environ, PYTHONPATH=os.path.abspath(checkout), PYTHONUNBUFFERED="1")
    log_path = os.path.join(logdir, "cleanrl.log")
    print("$", shlex.join(cmd), f"> {log_path}", flush=True)
    start, cpu_before = time.monotonic(), _children_cpu_seconds()
    proc = subprocess.Popen(
        cmd, cwd=logdir, env=env_vars, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    trained, returns = None, []
    try:
        with open(log_path, "w") as log:
            log.write("$ " + " ".join(cmd) + "\n")
            for line in proc.stdout:
                log.write(line)
                if trained is None and CLEANRL_TRAINED.match(line):
                    cpu = psutil.Process(proc.pid).cpu_times()
                    trained = (time.monotonic() - start, cpu.user + cpu.system)
                m = CLEANRL_EVAL.match(line)
                if m:
                    returns.append(float(m.group(1)))
        code = proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if code or trained is None or not returns:
        raise SystemExit(f"{logdir}: CleanRL's dqn.py failed (exit status {code}); see {log_path}.")
    record = dict(
        process_wall_seconds=time.monotonic() - start,
        cpu_seconds=_children_cpu_seconds() - cpu_before,
        trained_wall_seconds=trained[0],
        trained_cpu_seconds=trained[1],
        final_eval_returns=returns,
        final_eval_return_mean=sum(returns) / len(returns),
        command=cmd,
    )
    atomic_write(os.path.join(logdir, "process.json"), json.dumps(record))
    return record


def run_dir(out: str, system: str, env: str, seed: int) -> str:
    """The run directory of (system, env, seed) in `out`."""
    return os.path.join(out, f"{system}-{env.replace('/', '_')}-s{seed}")


def run(
    env: str, seeds: list[int], total_steps: int, out: str, order_seed: int, cleanrl: tuple[str, str] | None = None
) -> None:
    """Trains the batch's runs that did not finish yet, in the shuffled order (module doc); `cleanrl` is
    (its Python, its checkout) to add CleanRL's runs to the batch."""
    systems = SYSTEMS + ((CLEANRL,) if cleanrl else ())
    batch = [(system, seed) for system in systems for seed in seeds]
    random.Random(order_seed).shuffle(batch)
    for system, seed in batch:
        logdir = run_dir(out, system, env, seed)
        if system == CLEANRL:
            if not os.path.exists(os.path.join(logdir, "process.json")):  # a failed run's directory has none
                run_cleanrl(*cleanrl, env, seed, total_steps, logdir)
            continue
        summary = os.path.join(logdir, "summary.json")
        if os.path.exists(summary) and finished(json.load(open(summary)), total_steps):
            continue
        extra = ["--eval-every", str(preset_eval_every(env))] if system.startswith("sb3-") else []
        start, cpu = time.monotonic(), _children_cpu_seconds()
        run_one(system, env, seed, total_steps, logdir, extra)
        measured = dict(process_wall_seconds=time.monotonic() - start, cpu_seconds=_children_cpu_seconds() - cpu)
        atomic_write(os.path.join(logdir, "process.json"), json.dumps(measured))


def _children_cpu_seconds() -> float:
    """User + system CPU seconds of every process this one started and waited for, their own children (waited
    for by them) included: a run's processes, summed over all of them."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _training_seconds(row: dict) -> float:
    """A metrics row's (or summary's) training wall-clock without the time its evaluations took: rlfleet's rows
    count both and say how much went to evaluations (`evaluation_seconds`); the SB3 peer's count training only."""
    return float(row["wall_seconds"]) - float(row.get("evaluation_seconds") or 0.0)


def _first_at(rows: list[dict], threshold: float) -> float | None:
    """The training wall-clock (`_training_seconds`) of the first metrics row whose evaluation return is at or
    above `threshold`."""
    for row in rows:
        value = row.get("eval_return_mean")
        if value is not None and value >= threshold:
            return _training_seconds(row)
    return None


def report(out: str, env: str, threshold: float) -> dict:
    """{system: {finals, process_wall_seconds, cpu_seconds, seconds_to_threshold (None for CleanRL), and their
    estimates}, "ratios": rlfleet's medians over SB3's, "ratios_cleanrl": over CleanRL's (when it ran)}."""
    result = {}
    prefix = lambda system: f"{system}-{env.replace('/', '_')}-s"  # noqa: E731
    for system in SYSTEMS + (CLEANRL,):
        dirs = sorted(d for d in os.listdir(out) if d.startswith(prefix(system)))
        if system == CLEANRL:  # a run that failed left no process.json: `run` again to redo it
            dirs = [d for d in dirs if os.path.exists(os.path.join(out, d, "process.json"))]
        if system == CLEANRL and not dirs:
            continue
        processes = []
        for d in dirs:
            with open(os.path.join(out, d, "process.json")) as f:
                processes.append(json.load(f))
        walls = [p["process_wall_seconds"] for p in processes]
        cpus = [p["cpu_seconds"] for p in processes if "cpu_seconds" in p]  # none in records made before it was
        if system == CLEANRL:
            finals, to_threshold, never = [p["final_eval_return_mean"] for p in processes], None, None
            trained = [p["trained_wall_seconds"] for p in processes]
            trained_cpu = [p["trained_cpu_seconds"] for p in processes]
        else:
            finals, to_threshold, never, trained, trained_cpu = [], [], 0, None, None
            for r in load_runs([os.path.join(out, d) for d in dirs]):
                finals.append(float(r["summary"]["final_eval_return_mean"]))
                t = _first_at(r["rows"], threshold)
                never += t is None
                to_threshold.append(t if t is not None else _training_seconds(r["summary"]))
        result[system] = dict(
            **(
                dict(
                    trained_wall_seconds=trained,
                    trained_wall=interval_estimates(trained),
                    trained_cpu_seconds=trained_cpu,
                    trained_cpu=interval_estimates(trained_cpu),
                )
                if system == CLEANRL
                else {}
            ),
            runs=dirs,
            final_eval_return=finals,
            final=interval_estimates(finals),
            process_wall_seconds=walls,
            process_wall=interval_estimates(walls),
            cpu_seconds=cpus,
            cpu=interval_estimates(cpus) if len(cpus) == len(walls) else None,
            seconds_to_threshold=to_threshold,
            to_threshold=interval_estimates(to_threshold) if to_threshold else None,
            never_reached_threshold=never,
        )

    def ratios(a: dict, b: dict) -> dict:
        median = statistics.median
        return dict(
            process_wall=median(a["process_wall_seconds"]) / median(b["process_wall_seconds"]),
            to_threshold=median(a["seconds_to_threshold"]) / median(b["seconds_to_threshold"])
            if b["seconds_to_threshold"]
            else None,
            cpu=median(a["cpu_seconds"]) / median(b["cpu_seconds"]) if a["cpu"] and b["cpu"] else None,
        )

    result["ratios"] = ratios(result["dqn"], result["sb3-dqn"])
    if CLEANRL in result:
        result["ratios_cleanrl"] = ratios(result["dqn"], result[CLEANRL])
    result.update(env=env, threshold=threshold)
    return result


def _estimate(e: dict, fmt: str) -> str:
    """'median M, IQM I [low, high]' of an `interval_estimates` result, each number as `fmt` formats it."""
    low, high = e["iqm_ci95"]
    return f"median {fmt.format(e['median'])}, IQM {fmt.format(e['iqm'])} [{fmt.format(low)}, {fmt.format(high)}]"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--env", required=True)
    r.add_argument("--seeds", type=int, nargs="+", required=True)
    r.add_argument("--total-steps", type=int, required=True, help="env steps per run")
    r.add_argument("--out", required=True, help="folder of the run directories")
    r.add_argument("--order-seed", type=int, default=0, help="seeds the shuffled order of the runs")
    r.add_argument("--cleanrl-python", default=None, help="the Python of CleanRL's environment (module doc)")
    r.add_argument("--cleanrl-dir", default=None, help="a checkout of CleanRL: its cleanrl/dqn.py runs too")
    q = sub.add_parser("report")
    q.add_argument("out", help="the folder `run` wrote")
    q.add_argument("--env", required=True)
    q.add_argument("--threshold", type=float, required=True, help="the return whose first evaluation is timed")
    q.add_argument("--json", default=None, help="write the report here")
    args = p.parse_args()
    if args.command == "run":
        if (args.cleanrl_python is None) != (args.cleanrl_dir is None):
            p.error("--cleanrl-python and --cleanrl-dir go together: give both to add CleanRL's runs, or neither")
        cleanrl = (args.cleanrl_python, args.cleanrl_dir) if args.cleanrl_dir else None
        run(args.env, args.seeds, args.total_steps, args.out, args.order_seed, cleanrl)
        return
    res = report(args.out, args.env, args.threshold)
    for system in SYSTEMS + (CLEANRL,):
        s = res.get(system)
        if s is None:
            continue
        print(f"{system} ({len(s['runs'])} seed{'s' if len(s['runs']) != 1 else ''})")
        print(f"  final eval return: {_estimate(s['final'], '{:.1f}')}")
        print(f"  whole process wall-clock to the budget (s): {_estimate(s['process_wall'], '{:.1f}')}")
        if s["cpu"]:
            print(f"  CPU seconds, all its processes: {_estimate(s['cpu'], '{:.1f}')}")
        if "trained_wall" in s:
            print(f"  wall-clock to the end of its training (s): {_estimate(s['trained_wall'], '{:.1f}')}")
            print(f"  CPU seconds to the end of its training: {_estimate(s['trained_cpu'], '{:.1f}')}")
        if s["to_threshold"]:
            print(
                f"  training wall-clock to {res['threshold']:g} (s): {_estimate(s['to_threshold'], '{:.1f}')}"
                f" ({s['never_reached_threshold']} never reached it: their whole training time counted)"
            )
    for key, peer in (("ratios", "SB3"), ("ratios_cleanrl", "CleanRL")):
        if key not in res:
            continue
        r = res[key]
        to = f", to the threshold {r['to_threshold']:.2f}x" if r["to_threshold"] else ""
        cpu = f", CPU seconds {r['cpu']:.2f}x" if r["cpu"] else ""
        print(f"rlfleet / {peer}, medians: whole process {r['process_wall']:.2f}x{to}{cpu}")
    if args.json:
        atomic_write(args.json, json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
