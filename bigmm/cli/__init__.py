"""The ``bigmm`` command: multiply | gram | plan | generate | verify | demo | bench.

Every error a user can cause ends in one line on stderr (``bigmm: error: ...``) and exit status 2;
``--debug`` shows the traceback instead. ``verify`` exits 0 on pass and 1 on fail. An interrupted
``multiply`` prints the command that resumes it and exits 130 (Ctrl-C) or 143 (SIGTERM, as a
batch scheduler sends before it kills a job). Under ``--json`` a command prints one JSON object
on stdout whatever happens: its summary with ``ok`` true, or ``ok`` false with the error; a
signal once it is printed leaves the exit status it gives (0 for ``ok`` true).
"""

from __future__ import annotations

import sys
import traceback

from ..errors import BigmmError, UsageError
from ._common import (ANSWERED, EXIT_ERROR, EXIT_FAIL, EXIT_INTERNAL, EXIT_INTERRUPTED, SIGNALS,
                      err, fail_json, interrupted_status, one_line, quiet_stdout)
from .parser import build_parser

__all__ = ["EXIT_ERROR", "EXIT_FAIL", "EXIT_INTERNAL", "EXIT_INTERRUPTED", "build_parser",
           "main"]


def main(argv=None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    ANSWERED.clear()
    restore = _watch_signals()
    try:
        return _main(argv)
    except KeyboardInterrupt:  # outside a command's own handling (parsing), or a second one
        return _interrupted(argv)
    finally:
        restore()


def _main(argv: list) -> int:
    try:
        args = build_parser().parse_args(argv)
    except UsageError as e:  # on stderr already, as argparse writes it
        fail_json(argv, EXIT_ERROR, str(e), type(e).__name__)
        return EXIT_ERROR
    except SystemExit as e:  # --help and --version
        return int(e.code or 0) if isinstance(e.code, int) else EXIT_ERROR
    args.argv = argv
    args.failure = {}  # what a command adds to its --json answer when it fails
    debug = getattr(args, "debug", False)
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # stdout closed by its reader (`... --json | head -1`)
        quiet_stdout()
        return 0
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        return _interrupted(args)
    except (BigmmError, OSError, MemoryError) as e:
        if debug:
            traceback.print_exc()
        return _failed(args, EXIT_ERROR, one_line(e), type(e).__name__)
    except Exception as e:  # a bug: still one line unless --debug
        if debug:
            traceback.print_exc()
        if SIGNALS:  # Ctrl-C inside an extension's import, which turned it into an ImportError
            return _interrupted(args)
        return _failed(args, EXIT_INTERNAL, f"internal error: {type(e).__name__}: "
                       f"{one_line(e)} (run with --debug for details)", type(e).__name__)


def _interrupted(args) -> int:
    """A signal outside a run's own handling: the interruption, or, where the command printed
    its JSON answer already (closing files, joining threads), the status that answer gives."""
    if ANSWERED:
        return ANSWERED[0]
    return _failed(args, interrupted_status(), "interrupted", "KeyboardInterrupt")


def _failed(args, status: int, message: str, error_type: str) -> int:
    """The failure on stderr (one line), and as JSON on stdout under ``--json`` (``args``
    parsed, with what the command added, or the command line's words)."""
    err(message)
    fail_json(args, status, message, error_type, **getattr(args, "failure", {}))
    return status


def _watch_signals():
    """Record Ctrl-C and SIGTERM while the command runs (in ``SIGNALS``, emptied first),
    raising KeyboardInterrupt as Python does for Ctrl-C: a run stops as it does for Ctrl-C,
    its finished tiles journaled, and says how to resume. Where one lands inside the import of
    a C extension (numpy's), the import may fail with another error, which is then the
    interruption. Only where Python's own handlers are installed, in the main thread. Returns
    what restores them."""
    import signal

    def handler(signum, frame):
        SIGNALS.append(signum)
        raise KeyboardInterrupt

    SIGNALS.clear()
    restore = []
    try:
        for sig, default in ((signal.SIGINT, signal.default_int_handler),
                             (signal.SIGTERM, signal.SIG_DFL)):
            if signal.getsignal(sig) is default:
                signal.signal(sig, handler)
                restore.append((sig, default))
    except ValueError:  # not the main thread
        pass
    return lambda: [signal.signal(sig, default) for sig, default in restore]
