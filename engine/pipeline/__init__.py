"""The client core: text to model input and model output to decisions, the same wherever
the model runs (in-process, Triton's text model, a remote client). Torch-free; imports only
engine.errors, engine.settings and its own modules.

inputs (a call's options and limits), rules (a family's decision rules), families, spec
(the manifest), text (sentences), lexical (BM25), encode (tokens and blocks), batching,
decide (probabilities to kept sentences), budget (a call's token budget)."""
