"""Remote models: the Pruner and Compressor APIs on a model served elsewhere, above the Pruner and
over the Triton transport (engine.triton): a Triton text model's client (text_pruner), a Pruner on a
Triton core model and the compressor's text model (connect: `Pruner.connect`'s and
`Compressor.connect`'s work), the HTTP API's clients (http_client) and the text model's health probe
(probe)."""
