"""The error types a run ends with that are the user's to act on, not crashes."""


class ConfigError(ValueError):
    """A setting a run cannot use; the message starts with the setting's name."""


class DoesNotFit(Exception):
    """A run whose one shape is fixed (workflow=convergence) ran out of memory: nothing else to try,
    so the run ends with one line naming what did not fit and what to change (exit 2)."""
