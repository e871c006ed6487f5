"""``python -m bigmm``: the same as the ``bigmm`` command."""

import sys

from ._command import run

sys.exit(run())
