"""``python -m bigmm``: the same as the ``bigmm`` command."""

import sys

from .cli import main

sys.exit(main())
