"""NumPy arrays as the output C (:class:`bigmm.io.sink.ArraySink`): written in place, old C
read from them, and the arrays refused."""

import numpy as np
import pytest

from bigmm.errors import DtypeError, OutputNotWritable, ShapeError
from bigmm.testing import random_matrix
from sink_cases import BM, BN, SHAPE, new_sink, tiles, write_tiles


def test_array_outputs():
    data = random_matrix(SHAPE, np.float32, seed=13)
    sink = new_sink(None, [])
    write_tiles(sink, data, tiles())
    sink.finish()
    np.testing.assert_array_equal(sink.result, data)
    target = np.full(SHAPE, np.nan, np.float32)
    sink = new_sink(target, [], reads_c=True)
    buf = np.empty((BM, BN), np.float32)
    sink.read(0, BM, 0, BN, buf)
    assert np.isnan(buf).all()
    write_tiles(sink, data, tiles())
    assert sink.result is target
    np.testing.assert_array_equal(target, data)


@pytest.mark.parametrize("array, error, word", [
    (np.empty((SHAPE[0], SHAPE[1] + 1), np.float32), ShapeError, "(97, 62)"),  # wrong shape
    (np.empty(SHAPE, np.float64), DtypeError, "float64"),                       # wrong dtype
    (np.broadcast_to(np.float32(1), SHAPE), OutputNotWritable, "read-only"),    # read-only
])
def test_bad_array_outputs(array, error, word):
    with pytest.raises(error, match="Expected") as err:
        new_sink(array, [])
    assert word in str(err.value)
