"""The text and decision pipeline: text to model input and model output to decisions, the same
wherever the model runs (in-process, Triton's text model, a remote client). Torch-free; imports
only engine.errors, engine.settings and its own modules.

inputs (a call's options, limits and rules), option_schema (the options as each surface shows
them), families (the families and their rules' defaults), spec (the manifest and its tokenizer),
text (sentences, the engine's splitter and the families' own), encode (tokens, blocks, batches, the
unknown share), decide (probabilities to kept sentences, the lexical fusion), results (what a call
returns), budget (a call's token budget), token_compress, lingua_words and lingua_decide
(LLMLingua-2)."""
