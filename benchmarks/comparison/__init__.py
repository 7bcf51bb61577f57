"""The comparison suite's parts (issue 11, part 2), one job a file; the command is
`python -m benchmarks.compare_gateways`.

- `plan`: what is run (the full plan and `--quick`'s): loads, durations, the stream;
- `upstream`: the fixed-answer upstream every peer routes to, in a process of its own;
- `step`: one load step through one peer, with the CPU of every process tree and RSS;
- `peer_round`: everything measured of one peer in one round, in order;
- `summary`: across rounds: differences against direct within a round, medians, the
  throughput frontier, the streams sustained;
- `tables`, `reading`, `report`: the `## Gateways compared` section of
  benchmarks/RESULTS.md: its tables, its reading, and the whole.
"""
