"""User-facing errors: one line, exit code 2, no traceback unless --debug."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable


class UserError(Exception):
    """Bad input from the user (config, data, paths). Printed as one line; exit code 2."""

    exit_code = 2


class ConfigError(UserError):
    """An invalid configuration key or value."""


class DataError(UserError):
    """A malformed or missing data file; the message names the file and line."""


def run_guarded(func: Callable[[], int], debug: bool = False) -> int:
    """Run a command, turning UserError into a one-line message and exit code 2."""
    debug = debug or bool(os.environ.get("RLHFKIT_DEBUG"))
    try:
        return func()
    except UserError as e:
        if debug:
            raise
        print(f"rlhfkit: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("rlhfkit: interrupted", file=sys.stderr)
        return 130
