"""The ``bigmm`` command: multiply | gram | plan | generate | verify | demo | bench.

Every error a user can cause ends in one line on stderr (``bigmm: error: ...``) and exit status 2;
``--debug`` shows the traceback instead. ``verify`` exits 0 on pass and 1 on fail. An interrupted
``multiply`` prints the command that resumes it and exits 130.
"""

from __future__ import annotations

import sys
import traceback

from ..errors import BigmmError
from ._common import (EXIT_ERROR, EXIT_FAIL, EXIT_INTERNAL, EXIT_INTERRUPTED, err, one_line,
                      quiet_stdout)
from .parser import build_parser

__all__ = ["EXIT_ERROR", "EXIT_FAIL", "EXIT_INTERNAL", "EXIT_INTERRUPTED", "build_parser",
           "main"]


def main(argv=None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    restore = _watch_sigint()
    try:
        return _main(argv)
    except KeyboardInterrupt:  # outside a command's own handling (parsing), or a second one
        err("interrupted")
        return EXIT_INTERRUPTED
    finally:
        restore()


def _main(argv) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help, --version and usage errors
        return int(e.code or 0) if isinstance(e.code, int) else EXIT_ERROR
    args.argv = argv
    debug = getattr(args, "debug", False)
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # stdout closed by its reader (`... --json | head -1`)
        quiet_stdout()
        return 0
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        err("interrupted")
        return EXIT_INTERRUPTED
    except (BigmmError, OSError, MemoryError) as e:
        if debug:
            traceback.print_exc()
        err(one_line(e))
        return EXIT_ERROR
    except Exception as e:  # a bug: still one line unless --debug
        if debug:
            traceback.print_exc()
        if _SIGINTS:  # Ctrl-C inside an extension's import, which turned it into an ImportError
            err("interrupted")
            return EXIT_INTERRUPTED
        err(f"internal error: {type(e).__name__}: {one_line(e)} (run with --debug for details)")
        return EXIT_INTERNAL


#: Ctrl-Cs seen by the command (:func:`_watch_sigint`).
_SIGINTS: list = []


def _watch_sigint():
    """Count Ctrl-Cs while the command runs (in ``_SIGINTS``, emptied first), raising
    KeyboardInterrupt as Python does: where one lands inside the import of a C extension
    (numpy's), the import may fail with another error, which is then the interruption. Only
    where Python's own handler is installed, in the main thread. Returns what restores the
    handler."""
    import signal

    def handler(signum, frame):
        _SIGINTS.append(signum)
        raise KeyboardInterrupt

    _SIGINTS.clear()
    try:
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, handler)
            return lambda: signal.signal(signal.SIGINT, signal.default_int_handler)
    except ValueError:  # not the main thread
        pass
    return lambda: None
