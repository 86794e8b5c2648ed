"""Context pruning and semantic highlighting with an accelerated core."""
__version__ = "0.1.0"
