"""HDF5 and Zarr I/O: operand specs, validated inputs with fast parallel reads, crash-safe
outputs.

* :func:`parse_spec` / :class:`Spec`: ``"file.h5:/group/dataset"``, ``"store.zarr[:/array]"``.
* :func:`open_input` -> :class:`Source`: thread-safe ``read(r0, r1, c0, c1, out)``.
* :func:`open_output` -> :class:`Sink`: ``write``/``commit``/``finish`` with a resume journal.
* :func:`read_journal`, :func:`journaled_tiles`: the job recorded for an interrupted output,
  and how many of its tiles are journaled.
* :func:`existing_dtype`: the dtype of an output that is kept (and so decides C's dtype);
  :func:`refuse_output_alias`: an output that is one of the inputs refused, nothing opened;
  :func:`output_spec`: where an output is stored.
* :func:`h5_type` / :func:`stored_dtype`: the HDF5 type bigmm writes a dtype in (bfloat16:
  see :mod:`._h5`), and the dtype a dataset stores.
* :mod:`.generate`: seeded random operands (``bigmm.io.generate.generate``).
"""

from __future__ import annotations

from . import generate
from ._h5 import dtype_name as describe_dtype
from ._h5 import h5_type, stored_dtype
from .identity import same_data
from .layout import Layout, probe_layout
from .journal import journaled_tiles, read_journal
from .existing import existing_dtype, output_spec, refuse_output_alias
from .output import open_output
from .sink import Sink
from .source import Source, open_input
from .spec import Spec, parse_spec

__all__ = ["Layout", "Sink", "Source", "Spec", "describe_dtype", "existing_dtype", "generate",
           "same_data",
           "h5_type", "journaled_tiles", "open_input", "open_output", "parse_spec",
           "probe_layout", "read_journal", "output_spec", "refuse_output_alias", "stored_dtype"]
