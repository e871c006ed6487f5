"""The executor: runs a Plan, read -> copy in -> compute -> copy out -> write, with bounded
buffers.

It is generic over the Backend protocol and the io Source/Sink interfaces:

* :mod:`.run`: ``execute`` and the run loop, which issues each step's copies and gemm;
* :mod:`.loads`: the run's buffers and the readers that fill them ahead of the compute;
* :mod:`.writer`: the thread that writes finished tiles and commits them to the journal;
* :mod:`.hooks`: work added at named points of the steps (the checksum hook);
* :mod:`.tuning`: how the work is cut into pieces (the fill's and the drain's, the I/O's).

The names below are those the rest of bigmm runs plans with.
"""

from __future__ import annotations

from ..runstats import STAGES, Progress, RunStats
from .loads import in_place
from .run import execute
from .tuning import COMMIT_INTERVAL

__all__ = ["COMMIT_INTERVAL", "STAGES", "Progress", "RunStats", "execute", "in_place"]
