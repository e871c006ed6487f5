"""``python -m bigmm``: the same as the ``bigmm`` command."""

import os
import sys

try:
    from ._command import run
except KeyboardInterrupt:  # Ctrl-C before the command's own guard is in place
    try:
        print("bigmm: error: interrupted", file=sys.stderr, flush=True)
    finally:
        os._exit(130)

sys.exit(run())
