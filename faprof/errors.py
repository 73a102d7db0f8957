"""The one exception type for errors a user can cause (bad scenario, missing tool, no GPU...)."""


class FaprofError(Exception):
    """An error the user can fix. The message says what went wrong and what to do.

    The CLI prints it without a traceback and exits with code 2.
    """
