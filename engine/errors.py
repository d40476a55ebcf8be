"""The engine's one user-facing error: `python -m engine` prints it as one line and exits with code 2."""


class EngineError(Exception):
    """Bad input or an unavailable feature, explained in one line (no traceback)."""
