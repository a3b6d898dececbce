"""User-facing errors. The CLI prints these as one line and exits 1; anything else is a bug."""


class MsprobeError(Exception):
    """An error caused by the user's input (config, files, arguments), not by msprobe itself."""


class ConfigError(MsprobeError):
    """A config field has a value that is not allowed.

    Args:
        field: dotted name of the field, e.g. ``statistics.summary_mode``.
        value: the value given.
        allowed: what would have been accepted, in words.
    """

    def __init__(self, field, value, allowed):
        self.field, self.value, self.allowed = field, value, allowed
        super().__init__(f"config field '{field}': got {value!r}; allowed: {allowed}")


class DumpFormatError(MsprobeError):
    """A dump file is missing, truncated or not in the dump format."""
