"""Errors a user can fix: the CLI prints the message on one line and exits non-zero."""


class LzError(Exception):
    """Bad input or an unusable environment; the message names the problem and the fix."""
