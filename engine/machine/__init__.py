"""This machine and how fast it runs things: what its CPU computes fast and so which precisions
`--precision auto` tries (cpu), timing models against each other in interleaved rounds (timing),
and the machine in a report's words (describe). Torch-free, below the pruner: `prune export
--precision auto`, `prune bench` and the benchmarks use them."""
