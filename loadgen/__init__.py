"""Load on a learner without envs or replay: simulated actors that register, stream weights and heartbeat as real
ones do (the load benchmark, `benchmarks/load.py`, and its test). Nothing in the product imports it."""
