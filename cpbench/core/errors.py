"""The one error type for settings a run cannot use."""


class ConfigError(ValueError):
    """A setting a run cannot use; the message starts with the setting's name."""
