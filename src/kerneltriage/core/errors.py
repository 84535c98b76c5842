"""The one error type that reaches the user as a one-line message with exit status 2."""


class InputError(Exception):
    """Bad input from the user: a file, a flag, a model, a prompt.

    The message names the input and what was expected; the CLI prints it on one line
    and exits with status 2 (no traceback unless --debug).
    """
