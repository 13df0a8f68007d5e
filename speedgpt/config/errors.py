"""The exception of every configuration problem."""


class ConfigError(ValueError):
    """A configuration value is unknown, mistyped or inconsistent; the message names the fix."""
