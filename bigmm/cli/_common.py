"""What every command shares: exit codes, one-line errors on stderr and, under ``--json``,
one JSON answer on stdout."""

from __future__ import annotations

import os
import re
import sys

from ..errors import BigmmError

EXIT_FAIL, EXIT_ERROR, EXIT_INTERNAL, EXIT_INTERRUPTED = 1, 2, 3, 130

#: The signals (SIGINT, SIGTERM) that interrupted the running command, in order.
SIGNALS: list = []

#: Not empty once the running command printed its JSON answer (``--json``): holds the exit
#: status that answer gives (0 for ``ok`` true, else its ``exit_code``).
ANSWERED: list = []


def interrupted_status() -> int:
    """The exit status of an interrupted command: 128 + the signal (130 for Ctrl-C, 143 for
    SIGTERM, as a shell reports them)."""
    return 128 + SIGNALS[-1] if SIGNALS else EXIT_INTERRUPTED


def err(message: str) -> None:
    print(f"bigmm: error: {message}", file=sys.stderr)


def json_asked(args) -> bool:
    """Whether the command was given ``--json``: ``args`` parsed, or the words of a command
    line that did not parse (``--json`` before any ``--``)."""
    if isinstance(args, list):
        words = args[:args.index("--")] if "--" in args else args
        return "--json" in words
    return bool(getattr(args, "json", False))


def print_json(record: dict) -> None:
    """``record`` on stdout as the command's one JSON object: a second (a failure after the
    summary was printed) is dropped."""
    if ANSWERED:
        return
    ANSWERED.append(0 if record.get("ok") else int(record.get("exit_code", EXIT_ERROR)))
    import json

    try:
        print(json.dumps(record, indent=2, default=str), flush=True)
    except (BrokenPipeError, ValueError):  # stdout closed by its reader
        quiet_stdout()


def ok_json(summary: dict) -> None:
    """A command's summary as its JSON answer, ``ok`` true first."""
    print_json({"ok": True, **summary})


def fail_json(args, status: int, message: str, error_type: str, **extra) -> None:
    """Where the command was given ``--json``, the failure as one JSON object on stdout
    (``ok`` false, the message as on stderr, the error's class and the exit status, then
    ``extra``), so that a script parsing stdout gets an answer whatever happened."""
    if json_asked(args):
        print_json({"ok": False, "error": message, "error_type": error_type,
                    "exit_code": status, **extra})


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


#: Option names a message begins with ("Expected io_threads as ..."), written as flags.
NAMED = ("io_threads", "host_memory", "memory", "alpha", "beta", "out_dtype", "samples",
         "probes", "exact_limit", "c0")


def as_flags(text: str) -> str:
    """``text`` with Python option names written as the command line's flags."""
    for word, flag in FLAGS:
        text = re.sub(rf"(?<![\w.]){re.escape(word)}", flag, text)
    names = "|".join(NAMED)
    return re.sub(rf"\bExpected ({names})\b(?![=(\w])",
                  lambda m: "Expected --" + m.group(1).replace("_", "-"), text)


def one_line(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    if isinstance(e, OSError) and not isinstance(e, BigmmError) and e.filename:
        text = f"{e.strerror or text}: {e.filename}"
    return " ".join(as_flags(text).split())
