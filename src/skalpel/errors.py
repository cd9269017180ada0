"""Errors that reach the user as one clear line, never a traceback."""


class SkalpelError(Exception):
    """A problem the user can act on; the CLI prints its message and exits non-zero."""

    exit_code = 2


class TraceError(SkalpelError):
    """A trace file that cannot be read: missing, corrupt, empty, truncated or foreign."""
