"""Errors the engine raises on purpose, so callers can tell bad input from bad models."""


class PruneError(Exception):
    """Base class of the engine's own errors."""


class InputError(PruneError, ValueError):
    """The caller's input is invalid (empty question, wrong types, bad threshold...)."""


class ModelLoadError(PruneError, RuntimeError):
    """A model or checkpoint folder is missing, incomplete, corrupted or of an unknown layout."""


class ExportError(PruneError, RuntimeError):
    """Exporting a checkpoint failed, or the exported graph disagrees with PyTorch."""


class BackendError(PruneError, RuntimeError):
    """The accelerated core failed to run a batch (server down, session error...)."""


class SettingError(PruneError, ValueError):
    """A setting's PRUNE_* environment variable holds a value that does not parse or is not allowed."""


class Cancelled(PruneError):
    """The caller gave up on the call (its deadline passed): its work stopped between two
    batches (engine.cancellation.check_cancelled)."""
