"""User-facing errors. The CLI prints these as one line and exits 1; anything else is a bug."""

# Exit status of an analysis (compare, graph_visualize, overflow_check, summary) that ran on every step
# and rank it could read but skipped damaged ones, each named in one line on stderr: the user-error status,
# as the dump was bad input (2 stays a divergence under --fail-on-divergence, and wins).
EXIT_PARTIAL = 1


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
        shown = repr(str(field))[1:-1]  # a field name from a file may hold line breaks: keep one line
        super().__init__(f"config field '{shown}': got {value!r}; allowed: {allowed}")


class DumpFormatError(MsprobeError):
    """A dump file is missing, truncated or not in the dump format."""


def where(step, rank, is_proc=False):
    """How a one-line message names a step's rank dir: "step 1 rank 0", "step 0 process 4242"."""
    return f"step {step} {'process' if is_proc else 'rank'} {rank}"


def none_readable(errors, skipped):
    """What to say when no rank directory could be read: the one error's own message, or the first of
    the `skipped` lines (one per rank dir, each with its error in `errors`)."""
    return str(errors[0]) if len(errors) == 1 else f"no rank directory could be read; first: {skipped[0]}"
