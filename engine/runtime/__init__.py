"""Loading a model and running its calls: the backend an exported folder runs on (loading),
the default model, exported on first use (default_model), and a call's cancellation between
batches (cancel). Beside engine.pruner, above the backends."""
