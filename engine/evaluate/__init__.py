"""`prune eval`: sentence P/R/F1 and reranking MRR against labels (quality), its report
(quality_report), token budgets (quality_budget) and the lexical baseline (bm25). Nothing a
server runs imports this package."""
