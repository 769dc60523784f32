"""Errors that carry a message a person can act on (shown as-is by the app and the CLIs)."""


class PosvizError(ValueError):
    """Base class: bad input or bad files, described in words, never a crash deep in torch."""


class ConfigError(PosvizError):
    """A config has an unknown key, a wrong type, or an impossible value."""


class PositionLimitError(PosvizError):
    """A method was asked for a position it has no representation for (learned absolute past max_len)."""


class CacheLimitError(PositionLimitError):
    """A model's cache cannot be kept to the window a strategy asks for (DeepSeek-V4's layers keep their own window and
    compressed entries): a lab stops there and says why, as at a position limit."""


class CheckpointError(PosvizError):
    """A checkpoint folder or file is missing, truncated or does not match its config."""
