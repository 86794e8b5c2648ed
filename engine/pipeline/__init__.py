"""The client core: text to model input and model output to decisions, the same wherever
the model runs (in-process, Triton's text model, a remote client). Torch-free; imports only
engine.errors, engine.settings and its own modules.

inputs (a call's options and limits), families (the families and their decision rules), spec
(the manifest), text (sentences, the engine's splitter and the families' own), lexical (BM25),
encode (tokens, blocks and batches), decide (probabilities to kept sentences), budget (a call's
token budget)."""
