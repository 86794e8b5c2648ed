"""`prune bench` and `prune capacity`: the paths measured side by side on a RAG workload (registry,
session, runs, figures, report), this machine's limits (limits), the peers (peers, peer_worker),
replicas for a request rate (sizing), and what every benchmark shares (harness). Nothing a
server runs imports this package."""
