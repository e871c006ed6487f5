"""What every command shares: exit codes and one-line errors on stderr."""

from __future__ import annotations

import os
import re
import sys

from ..errors import BigmmError

EXIT_FAIL, EXIT_ERROR, EXIT_INTERNAL, EXIT_INTERRUPTED = 1, 2, 3, 130

#: The signals (SIGINT, SIGTERM) that interrupted the running command, in order.
SIGNALS: list = []


def interrupted_status() -> int:
    """The exit status of an interrupted command: 128 + the signal (130 for Ctrl-C, 143 for
    SIGTERM, as a shell reports them)."""
    return 128 + SIGNALS[-1] if SIGNALS else EXIT_INTERRUPTED


def err(message: str) -> None:
    print(f"bigmm: error: {message}", file=sys.stderr)


def fail_json(args, status: int, message: str, error_type: str, **extra) -> None:
    """Where the command was given ``--json``, the failure as one JSON object on stdout
    (``ok`` false, the message as on stderr, the error's class and the exit status), so that
    a script parsing stdout gets an answer whatever happened."""
    if not getattr(args, "json", False):
        return
    import json

    record = {"ok": False, "error": message, "error_type": error_type, "exit_code": status}
    record.update(extra)
    try:
        print(json.dumps(record, indent=2), flush=True)
    except (BrokenPipeError, ValueError):  # stdout closed by its reader
        quiet_stdout()


def quiet_stdout() -> None:
    """Point stdout at /dev/null, so that flushing it at exit raises nothing more."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


#: The library's messages name options as Python keywords; on the command line, as flags.
FLAGS = (("resume=True", "--resume"), ("overwrite=True", "--overwrite"),
         ("host_memory=", "--host-memory "), ("memory=", "--memory "),
         ("io_threads=", "--io-threads "), ("trans_a=True", "--trans-a"),
         ("trans_b=True", "--trans-b"), ("kernel=", "--kernel "), ("verify=", "--verify "),
         ("alpha=", "--alpha "), ("beta=", "--beta "), ("backend=", "--backend "),
         ("out_dtype=", "--out-dtype "), ("precision=", "--precision "))


def as_flags(text: str) -> str:
    """``text`` with Python option names written as the command line's flags."""
    for word, flag in FLAGS:
        text = re.sub(rf"(?<![\w.]){re.escape(word)}", flag, text)
    return text


def one_line(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    if isinstance(e, OSError) and not isinstance(e, BigmmError) and e.filename:
        text = f"{e.strerror or text}: {e.filename}"
    return " ".join(as_flags(text).split())
