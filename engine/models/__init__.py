"""Opening a model for the in-process pruner: the options and the backend an exported folder
or a checkpoint runs on (loading), and the default model, exported on first use
(default_model). Beside engine.pruner, above the backends."""
