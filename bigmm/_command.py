"""The ``bigmm`` command's entry point: imports the command line inside its own guard, so that
Ctrl-C while Python is still loading it ends quietly (exit 130), like Ctrl-C anywhere later;
once the command has returned, a further Ctrl-C or SIGTERM ends the process at once with its
status (the output is already journaled or complete: nothing is left to clean up but threads),
and an interrupted command ends with 130 at once."""

import atexit
import os
import signal
import sys


def _unraisable(info) -> None:
    """Ctrl-C landing in a callback that cannot raise (a weakref's, during an import) is the
    same interruption, already on its way: nothing to print."""
    if not isinstance(info.exc_value, KeyboardInterrupt):
        sys.__unraisablehook__(info)


def run() -> int:
    sys.unraisablehook = _unraisable
    code = 130
    try:
        from .cli import main

        code = main()
    except KeyboardInterrupt:  # while loading, or between main's own handlers
        answered = _answered()
        if answered is not None:  # after the --json answer: the status it gives
            code = answered
        else:
            try:
                print("bigmm: error: interrupted", file=sys.stderr)
                _interrupted_json()
            except KeyboardInterrupt:
                pass
    # ending: a Ctrl-C or SIGTERM while threads are joined exits at once with the status; after
    # that, Python restores the default action (death by the signal) unless it is ignored
    ending = [signal.SIGINT]
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:  # not where it was ignored
        ending.append(signal.SIGTERM)
    for sig in ending:
        signal.signal(sig, lambda *_: os._exit(code))
        atexit.register(signal.signal, sig, signal.SIG_IGN)
    if code == 130:
        # interrupted: CPython ends by SIGINT after a clean return where the KeyboardInterrupt
        # passed through code it ran for an import (its "unhandled" flag stays set); the run
        # has cleaned up already, so end now with the status
        _end(code)
    return code


def _answered():
    """The exit status of the command's ``--json`` answer where it printed one, else None."""
    common = sys.modules.get("bigmm.cli._common")  # loaded: it knows what was printed
    return common.ANSWERED[0] if common is not None and common.ANSWERED else None


def _interrupted_json() -> None:
    """Under ``--json``, the interruption as the command's one JSON answer on stdout, unless
    the command printed its own already."""
    words = sys.argv[1:]
    words = words[:words.index("--")] if "--" in words else words
    if "--json" not in words or _answered() is not None:
        return
    print('{"ok": false, "error": "interrupted", "error_type": "KeyboardInterrupt", '
          '"exit_code": 130}')


def _end(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
