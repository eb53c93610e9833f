"""benchmarks/dqn_peer.py: each run's whole process timed and its CPU counted, finished runs skipped, and the
report's wall-clock to the threshold and ratios (the runs themselves stand in for rlfleet and SB3: a child process
that burns CPU and writes a summary)."""

import json
import os
import subprocess
import sys

import pytest

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
sys.path.insert(0, BENCHMARKS)
import dqn_peer  # noqa: E402

BURN = """
import json, os, subprocess, sys, time
logdir, seconds, final = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
if final >= 0:  # a child of its own burns half of it, as rlfleet up's replay, learner and actors burn theirs
    subprocess.run([sys.executable, __file__, logdir, str(seconds / 2), "-1"], check=True)
    seconds /= 2
end = time.process_time() + seconds
while time.process_time() < end:
    pass
if final < 0:
    sys.exit(0)
os.makedirs(logdir, exist_ok=True)
rows = [dict(env_steps=1000 * i, wall_seconds=float(i), eval_return_mean=100.0 * i) for i in range(1, 6)]
if "sb3" not in logdir:  # rlfleet's rows count their evaluations' time too, and say how much: 0.5 s each
    rows = [dict(r, wall_seconds=r["wall_seconds"] + i / 2, evaluation_seconds=i / 2) for i, r in enumerate(rows, 1)]
with open(os.path.join(logdir, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\\n" for r in rows)
with open(os.path.join(logdir, "summary.json"), "w") as f:
    json.dump(dict(rows[-1], completed=True, final_eval_return_mean=final), f)
"""


@pytest.mark.slow
def test_run_times_each_process_counts_its_cpu_and_skips_finished_runs(tmp_path, monkeypatch):
    started = []

    burn = tmp_path / "burn.py"
    burn.write_text(BURN)

    def fake_run_one(system, env, seed, total_steps, logdir, extra):
        started.append((system, seed))
        cpu = 0.6 if system == "dqn" else 0.3
        subprocess.run([sys.executable, burn, logdir, str(cpu), str(400 + seed)], check=True, timeout=60)

    monkeypatch.setattr(dqn_peer, "run_one", fake_run_one)
    out = str(tmp_path / "peer")
    dqn_peer.run("CartPole-v1", [0, 1, 2], 5000, out, order_seed=0)
    assert sorted(started) == sorted((s, seed) for s in dqn_peer.SYSTEMS for seed in (0, 1, 2))
    for system, seed in started:
        with open(os.path.join(dqn_peer.run_dir(out, system, "CartPole-v1", seed), "process.json")) as f:
            process = json.load(f)
        burned = 0.6 if system == "dqn" else 0.3
        assert burned <= process["cpu_seconds"] < burned + 2.0, process
        assert process["process_wall_seconds"] >= burned * 0.9, process
    started.clear()
    dqn_peer.run("CartPole-v1", [0, 1, 2], 5000, out, order_seed=0)
    assert started == []  # every run finished: nothing is run again

    result = dqn_peer.report(out, "CartPole-v1", threshold=250)
    for system in dqn_peer.SYSTEMS:
        s = result[system]
        assert s["final_eval_return"] == [400.0, 401.0, 402.0]
        # The first row whose evaluation is >= 250, its evaluations' time left out: 4.5 - 1.5 s for rlfleet's.
        assert s["seconds_to_threshold"] == [3.0, 3.0, 3.0]
        assert s["never_reached_threshold"] == 0 and len(s["cpu_seconds"]) == 3
    assert result["ratios"]["to_threshold"] == pytest.approx(1.0)
    # rlfleet's stand-in burned twice the CPU (half of it in its own child): the report shows it.
    assert result["dqn"]["cpu"]["median"] > 1.3 * result["sb3-dqn"]["cpu"]["median"]
    assert result["ratios"]["cpu"] > 1.3

    never = dqn_peer.report(out, "CartPole-v1", threshold=1000)
    assert never["dqn"]["never_reached_threshold"] == 3
    assert never["dqn"]["seconds_to_threshold"] == [5.0, 5.0, 5.0]  # the whole training time (7.5 - 2.5 s) counted


FAKE_CLEANRL = """
import sys, time
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
assert args["--env-id"] == "CartPole-v1" and args["--train-frequency"] == "2", args
end = time.process_time() + 0.3
while time.process_time() < end:
    pass
print("global_step=100, episodic_return=[12.]")  # no flush: the line must come when printed all the same
print("model saved to runs/x/dqn.cleanrl_model")
time.sleep(1.0)  # its evaluation: after the end of training, left out of the timed part
for i, r in enumerate([412.0, 388.0]):
    print(f"eval_episode={i}, episodic_return=[{r}]")
sys.exit(int(args["--seed"]) == 13)
"""


@pytest.mark.slow
def test_cleanrl_run_is_timed_to_the_end_of_training_and_its_evaluation_parsed(tmp_path):
    checkout = tmp_path / "cleanrl"
    (checkout / "cleanrl").mkdir(parents=True)
    (checkout / "cleanrl" / "dqn.py").write_text(FAKE_CLEANRL)
    logdir = str(tmp_path / "out" / "cleanrl-dqn-CartPole-v1-s0")
    record = dqn_peer.run_cleanrl(sys.executable, str(checkout), "CartPole-v1", 0, 5000, logdir)
    assert record["final_eval_returns"] == [412.0, 388.0] and record["final_eval_return_mean"] == 400.0
    assert 0.3 <= record["trained_cpu_seconds"] <= record["cpu_seconds"] < 2.5, record
    assert record["trained_wall_seconds"] + 0.9 <= record["process_wall_seconds"], record  # its evaluation after
    with open(os.path.join(logdir, "process.json")) as f:
        assert json.load(f)["final_eval_returns"] == [412.0, 388.0]
    assert "model saved to" in open(os.path.join(logdir, "cleanrl.log")).read()
    with pytest.raises(SystemExit, match="exit status 1"):
        dqn_peer.run_cleanrl(sys.executable, str(checkout), "CartPole-v1", 13, 5000, str(tmp_path / "failed"))
    with pytest.raises(SystemExit, match="no cleanrl/dqn.py"):
        dqn_peer.run_cleanrl(sys.executable, str(tmp_path), "CartPole-v1", 0, 5000, str(tmp_path / "none"))


def test_cleanrl_flags_carry_the_preset_and_refuse_a_fractional_replay_ratio(monkeypatch):
    flags = dict(zip(*[iter(dqn_peer.cleanrl_flags("Acrobot-v1", 100_000)[:24])] * 2))
    assert flags["--batch-size"] == "128" and flags["--train-frequency"] == "2"
    assert flags["--target-network-frequency"] == "500"  # 250 learner steps of 2 env steps each
    assert float(flags["--exploration-fraction"]) == pytest.approx(0.12)
    preset = dqn_peer.make_algo_config
    # 64 / 48 env steps per gradient step: the script trains once every whole number of env steps.
    monkeypatch.setattr(
        dqn_peer, "make_algo_config", lambda *a: preset("dqn", "default", "CartPole-v1", {"samples_per_insert": 48.0})
    )
    with pytest.raises(ValueError, match="env steps per gradient step"):
        dqn_peer.cleanrl_flags("CartPole-v1", 100_000)
