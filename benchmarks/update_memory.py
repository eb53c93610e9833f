"""Learner memory per PPO update: resident memory growth over many BatchPPO updates in one process, no servers.

With Python 3.11, TensorFlow 2.15 keeps about 100 bytes for every eager op and every tf.function call it runs
(tensorflow/tensorflow#62551), so a learner that runs its update as hundreds of eager ops grows for as long as
it trains. `BatchPPO.update` runs as one graph call; the baseline, measured in the same run, is the same
advantage computation done eagerly (GAE as an eager `tf.scan`, as the learner did before).

A PPO learner also writes a metrics row per update (`MetricsLog.write`: a line of metrics.jsonl and a TensorBoard
scalar per field); the third phase writes the update's own diagnostics as one row per call, and its baseline, in the
same run, writes the same rows with eager summary ops (`MetricsLog` with no traced writer).

Each phase runs `--updates` calls on synthetic batches of the preset's shape (HalfCheetah-v5, default preset)
after 20 warm-up calls, and reports the growth in kB per call.

Usage:
    python benchmarks/update_memory.py --updates 1000
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import psutil  # noqa: E402
import tensorflow as tf  # noqa: E402

from rlfleet.algorithms.ppo.config import make_config  # noqa: E402
from rlfleet.algorithms.ppo.items import ppo_signature  # noqa: E402
from rlfleet.algorithms.ppo.learning import BatchPPO  # noqa: E402
from rlfleet.envs.core import env_spec  # noqa: E402
from rlfleet.learner.run_dir import MetricsLog  # noqa: E402


def synthetic_batch(spec, config, rng) -> dict:
    """A batch of the replay signature's fields, [T+1, envs × 4 actors, ...], small random values."""
    sig = ppo_signature(spec.obs_shape[0], spec.action_dim, config.envs_per_actor * 4, config.unroll_length)
    out = {}
    for name, s in sig.items():
        shape = s.shape.as_list()
        if s.dtype == tf.bool:
            out[name] = rng.random(shape) < 0.01
        elif s.dtype == tf.int64:
            out[name] = np.zeros(shape, np.int64)
        else:
            out[name] = (0.1 * rng.standard_normal(shape)).astype(np.float32)
    out["behaviour_log_std"][:] = -0.5
    return out


def growth_kb_per_call(fn, calls: int) -> float:
    proc = psutil.Process()
    for _ in range(20):
        fn()
    gc.collect()
    before = proc.memory_info().rss
    for _ in range(calls):
        fn()
    return (proc.memory_info().rss - before) / 1024 / calls


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--updates", type=int, default=1000, help="calls per phase")
    p.add_argument("--env", default="HalfCheetah-v5")
    p.add_argument("--out", default=None, help="write the results here as JSON")
    args = p.parse_args()
    spec, config = env_spec(args.env), make_config("default", args.env)
    ppo, rng = BatchPPO(spec, config, 0), np.random.default_rng(0)
    batch = synthetic_batch(spec, config, rng)
    t, n = batch["reward"].shape[0] - 1, batch["reward"].shape[1]
    deltas, not_end = rng.standard_normal((t, n)).astype(np.float32), np.ones((t, n), np.float32)

    def eager_gae():  # the learner's GAE before: an eager backward tf.scan
        tf.scan(lambda acc, x: x[0] + 0.99 * 0.95 * x[1] * acc, (deltas, not_end), tf.zeros([n]), reverse=True)

    row = dict(env_steps=0, learner_steps=0, policy_version=0, **ppo.update(batch, 0.5))
    tmp = tempfile.mkdtemp(prefix="update-memory-")
    log, eager_log = MetricsLog(os.path.join(tmp, "traced")), MetricsLog(os.path.join(tmp, "eager"))
    eager_log.TRACED_FIELD_SETS = 0

    def metrics_row(to=log):
        row["env_steps"] += 2048
        to.write(row)

    results = dict(
        env=args.env,
        calls=args.updates,
        baseline_eager_gae_kb_per_call=round(growth_kb_per_call(eager_gae, args.updates), 2),
        ppo_update_kb_per_call=round(growth_kb_per_call(lambda: ppo.update(batch, 0.5), args.updates), 2),
        baseline_eager_metrics_row_kb_per_call=round(
            growth_kb_per_call(lambda: metrics_row(eager_log), args.updates), 2
        ),
        metrics_row_kb_per_call=round(growth_kb_per_call(metrics_row, args.updates), 2),
        metrics_row_fields=len(row) - 1,
    )
    log.close()
    eager_log.close()
    shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(results, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
