"""What every command shares: exit codes and one-line errors on stderr."""

from __future__ import annotations

import os
import sys

from ..errors import BigmmError

EXIT_FAIL, EXIT_ERROR, EXIT_INTERNAL, EXIT_INTERRUPTED = 1, 2, 3, 130


def err(message: str) -> None:
    print(f"bigmm: error: {message}", file=sys.stderr)


def quiet_stdout() -> None:
    """Point stdout at /dev/null, so that flushing it at exit raises nothing more."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def one_line(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    if isinstance(e, OSError) and not isinstance(e, BigmmError) and e.filename:
        text = f"{e.strerror or text}: {e.filename}"
    return " ".join(text.split())
