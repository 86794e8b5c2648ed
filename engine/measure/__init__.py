"""How the engine measures: what this CPU computes fast (cpu), timing models against each
other (timing), a precision's fidelity and its gate (fidelity), and the data files they read
(datafiles). Torch-free, below the pruner: `prune export --precision auto`, `prune fidelity`,
`prune eval` and `prune bench` use them."""
