import os

import h5py
import numpy as np
import pytest

from bigmm.errors import ResumeError
from bigmm.io import open_input, open_output
from bigmm.io.journal import Journal, journal_path, parse_journal
from bigmm.io.spec import Spec
from bigmm.testing import random_matrix

HEADER = {"bigmm_journal": 1, "dataset": "/C", "job": {"alpha": 1.0}}


@pytest.mark.parametrize("tail", [
    b'{"tiles": [[9, 9]',   # torn mid-record, no newline
    b'{"til',               # torn early
    b"\x00\x00\x00",        # zeros from a crash after the size grew
    b'{"tiles": [[9, 9]]}',  # a whole record whose newline never landed
])
def test_torn_last_line_is_ignored_and_cut(tmp_path, tail):
    path = str(tmp_path / "c.h5.C.bigmm-journal")
    j = Journal.create(path, HEADER)
    j.append({"tiles": [[0, 0], [0, 1]]})
    j.append({"tiles": [[1, 0]]})
    j.close()
    with open(path, "ab") as fh:
        fh.write(tail)
    header, tiles, swap, _, _ = parse_journal(path)
    assert header == HEADER and tiles == {(0, 0), (0, 1), (1, 0)} and not swap
    j = Journal.load(path)
    j.append({"tiles": [[1, 1]]})
    j.close()
    assert parse_journal(path)[1] == {(0, 0), (0, 1), (1, 0), (1, 1)}
    assert open(path, "rb").read().count(b"\n") == 4


def test_garbage_complete_last_line_is_torn(tmp_path):
    path = str(tmp_path / "j")
    Journal.create(path, HEADER).close()
    with open(path, "ab") as fh:
        fh.write(b'{"tiles": [[0,\n')
    assert parse_journal(path)[1] == set()


def test_corrupt_middle_line_is_an_error(tmp_path):
    path = str(tmp_path / "j")
    with open(path, "wb") as fh:
        fh.write(b'{"job": {}}\nnot json\n{"tiles": [[0, 0]]}\n')
    with pytest.raises(ResumeError, match="line 2"):
        parse_journal(path)


@pytest.mark.parametrize("dataset, name", [
    ("/C", "c.h5.C.bigmm-journal"),              # top level
    ("/grp/out C", "c.h5.grp%2Fout%20C.bigmm-journal"),  # groups and spaces quoted
])
def test_journal_path(dataset, name):
    assert journal_path(Spec("dir/c.h5", dataset)) == os.path.realpath(f"dir/{name}")


def test_resume_after_torn_append(tmp_path):
    shape = (31, 29)
    data = random_matrix(shape, np.float64, seed=1)
    spec = f"{tmp_path}/c.h5:/C"
    kw = dict(shape=shape, dtype=np.float64, inputs=[], job={"plan": "p"})
    sink = open_output(spec, **kw)
    sink.write(0, 10, 0, 29, data[:10].copy())
    sink.commit([(0, 0)])
    sink.close()
    with open(f"{tmp_path}/c.h5.C.bigmm-journal", "ab") as fh:
        fh.write(b'{"tiles": [[1')
    with open_output(spec, resume=True, **kw) as sink:
        assert sink.done == {(0, 0)}
        sink.write(10, 31, 0, 29, data[10:].copy())
        sink.commit([(1, 0)])
        sink.finish()
    with open_input(spec) as src:
        out = np.full(shape, np.nan)
        src.read(0, 31, 0, 29, out)
    np.testing.assert_array_equal(out, data)
    with h5py.File(f"{tmp_path}/c.h5", "r") as f:
        assert f["C"].attrs["bigmm_complete"]
