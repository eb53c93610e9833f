"""Statistics over finished runs: IQMs and comparisons with bootstrap confidence intervals, evaluation curves read
from metrics.jsonl, and the report of a group of seeds (`rlfleet report`, `rlfleet up --seeds`, the benchmarks). It
imports nothing of rlfleet."""
