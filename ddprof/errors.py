"""The one exception type the CLI turns into a single-line message and exit code 2."""


class DdprofError(Exception):
    """A problem with the user's input or environment, explained in one line (no traceback)."""
