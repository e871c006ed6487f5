"""Zarr outputs with the guarantees of HDF5 ones: one chunk file per tile, published only once
durable and journaled after; resume (and its refusal of changed inputs), the completion mark
and job record, the partial array and its swap for beta != 0, aliasing refused, one writer,
arrays written in place; generate, verify and multiply from the command line. The chunk files'
own mechanics are in test_zarrfiles.py.

Real stores on disk, real runs of bigmm's executor (NumPy backend), fresh random data,
outputs checked against a float64 reference.
"""

from __future__ import annotations

import json
import os

import h5py
import numpy as np
import pytest

zarr = pytest.importorskip("zarr")

import bigmm  # noqa: E402
from bigmm import cli, errors  # noqa: E402
from bigmm.io import open_input, open_output, read_journal  # noqa: E402
from bigmm.io.generate import generate  # noqa: E402
from bigmm.io.journal import journal_path, lock_path  # noqa: E402
from bigmm.io.spec import parse_spec  # noqa: E402
from bigmm.io.identity import fingerprint  # noqa: E402
from bigmm.io.zarrsink import (OLD_SUFFIX, PARTIAL_SUFFIX, ZarrRegionSink,  # noqa: E402
                               ZarrSink)
from bigmm.testing import (random_matrix, reference_gemm, relative_error,  # noqa: E402
                           tolerance, zarr_array)
from zarr_cases import KW, K, M, N, _leftovers, _read  # noqa: E402


# ----- runs into Zarr outputs -------------------------------------------------------------------

RUNS = [
    # (output spec, inputs, alpha, beta, trans_a, trans_b)
    ("c.zarr", "zarr", 1.0, 0.0, False, False),            # the root array of a new store
    ("c.zarr:/grp/C", "zarr", 1.0, 0.0, False, False),     # an array in a new group
    ("in.zarr:/C", "zarr", -0.5, 0.0, True, True),         # beside the inputs, transposed
    ("c.zarr:/C", "hdf5", 2.0, 0.0, False, True),          # HDF5 inputs, Zarr C
    ("c.zarr:/C", "zarr", 1.5, -0.75, False, False),       # old C read, partial swapped in
    ("c.zarr", "zarr", 1.0, 1.0, True, False),             # the same for a root array
]


@pytest.mark.parametrize("out,inputs,alpha,beta,ta,tb", RUNS)
def test_runs_into_zarr(tmp_path, out, inputs, alpha, beta, ta, tb):
    a = random_matrix((K, M) if ta else (M, K), np.float64, seed=3)
    b = random_matrix((N, K) if tb else (K, N), np.float64, seed=4)
    if inputs == "zarr":
        sa = zarr_array(tmp_path / "in.zarr", a, path="A", chunks=(32, 41), codec="blosc")
        sb = f"{tmp_path / 'in.zarr'}:/B"
        zarr_array(tmp_path / "in.zarr", b, path="B", chunks=(50, 50), endian="big")
    else:
        with h5py.File(tmp_path / "in.h5", "w") as f:
            f["A"], f["B"] = a, b
        sa, sb = f"{tmp_path / 'in.h5'}:/A", f"{tmp_path / 'in.h5'}:/B"
    sc = str(tmp_path / out)
    c0 = None
    if beta:
        c0 = random_matrix((M, N), np.float64, seed=5)
        s = parse_spec(sc)
        zarr_array(s.path, c0, path=s.dataset.strip("/"), chunks=(64, 64), codec="gzip",
                   attributes={"units": "m"})
    result = bigmm.matmul(sa, sb, sc, alpha=alpha, beta=beta, trans_a=ta, trans_b=tb, **KW)
    assert result == sc
    got, attrs, arr = _read(sc)
    ref = reference_gemm(a, b, alpha=alpha, beta=beta, c=c0, trans_a=ta, trans_b=tb)
    assert relative_error(got, ref) <= tolerance(np.float64, K)
    assert attrs["bigmm_complete"] is True and json.loads(attrs["bigmm_job"])["result"]
    plan = bigmm.plan(sa, sb, trans_a=ta, trans_b=tb, **KW)
    assert arr.chunks == (min(plan.bm, M), min(plan.bn, N))  # one chunk per tile
    assert arr.compressors == () and arr.metadata.zarr_format == 3
    if beta:
        assert attrs["units"] == "m"  # old C's attributes carried over
    spec = parse_spec(sc)
    assert not os.path.exists(journal_path(spec)) and not os.path.exists(lock_path(spec))
    assert not _leftovers(spec.path)
    assert not [p for p in os.listdir(tmp_path) if PARTIAL_SUFFIX in p or OLD_SUFFIX in p]
    if spec.dataset != "/":
        assert not [p for p in os.listdir(spec.path) if "bigmm" in p]
    # bigmm verify agrees, and the output reads back as an input
    assert bigmm.verify.verify(sa, sb, sc, alpha=alpha, beta=beta, trans_a=ta, trans_b=tb,
                               c0=c0).passed


def test_chunks_appear_only_once_durable_and_committed(tmp_path, ab):
    sa, sb, a, b = ab
    srcs = [open_input(sa), open_input(sb)]
    spec = f"{tmp_path / 'c.zarr'}:/C"
    data = random_matrix((M, N), np.float64, seed=6)
    sink = open_output(spec, shape=(M, N), dtype=np.float64, inputs=srcs, job={"plan": "x"},
                       tile=(64, 64))
    folder = tmp_path / "c.zarr" / "C"
    assert sink.layout == "zarr-chunks" and sink.parallel_writes
    sink.write(0, 30, 0, 64, data[0:30, 0:64])  # rows of a tile as they arrive
    sink.write(30, 64, 0, 64, data[30:64, 0:64])
    sink.write(128, M, 64, N, data[128:, 64:])    # the corner tile
    written = [folder / "c" / "0" / "0", folder / "c" / "2" / "1"]
    assert not any(p.exists() for p in written)
    assert all(os.path.exists(f"{p}.bigmm-tmp") for p in written)  # (and some made ahead)
    sink.commit([(0, 0), (2, 1)])
    assert all(p.exists() and not os.path.exists(f"{p}.bigmm-tmp") for p in written)
    assert read_journal(spec) is not None and sink.journal.tiles == {(0, 0), (2, 1)}
    for i, j in ((0, 1), (1, 0), (1, 1), (2, 0)):
        r0, c0 = 64 * i, 64 * j
        sink.write(r0, min(M, r0 + 64), c0, min(N, c0 + 64), data[r0:r0 + 64, c0:c0 + 64])
    sink.commit([(0, 1), (1, 0), (1, 1), (2, 0)])
    sink.finish()
    sink.close()
    assert not _leftovers(folder)
    got, attrs, arr = _read(spec)
    assert np.array_equal(got, data) and attrs["bigmm_complete"]
    # a chunk file is the raw little-endian block, padded at the edges
    raw = np.fromfile(folder / "c" / "2" / "1", "<f8").reshape(64, 64)
    assert np.array_equal(raw[:M - 128, :N - 64], data[128:, 64:])
    assert np.isnan(arr.fill_value)


def test_an_interrupted_run_resumes(tmp_path, ab):
    sa, sb, a, b = ab
    sc = f"{tmp_path / 'c.zarr'}:/C"
    seen = []

    def stop(p):
        seen.append(p.tiles_done)
        if p.tiles_done >= 3:
            raise KeyboardInterrupt

    with pytest.raises(errors.Interrupted, match="resumable"):
        bigmm.matmul(sa, sb, sc, progress=stop, **KW)
    assert _read(sc)[1]["bigmm_complete"] is False
    with pytest.raises(errors.IncompleteOutputError):
        open_input(sc)
    with pytest.raises(errors.OutputExistsError, match="resume"):
        bigmm.matmul(sa, sb, sc, **KW)
    done = read_journal(sc)
    assert done is not None
    _, stats = bigmm.matmul(sa, sb, sc, resume=True, stats=True, **KW)
    assert stats.tiles_skipped >= 3 and stats.tiles_done == stats.tiles_total - stats.tiles_skipped
    assert relative_error(_read(sc)[0], a @ b) <= tolerance(np.float64, K)
    # idempotent: resuming a finished output of the same job computes nothing
    _, again = bigmm.matmul(sa, sb, sc, resume=True, stats=True, **KW)
    assert again.tiles_done == 0 and again.tiles_skipped == again.tiles_total
    # another job into it is refused
    with pytest.raises(errors.ResumeError, match="alpha"):
        bigmm.matmul(sa, sb, sc, alpha=2.0, resume=True, **KW)


CHANGED = [
    # (what happens to A between the interruption and the resume, a word of the refusal)
    (lambda arr: arr.__setitem__((57, 13), arr[57, 13] + 1), "contents"),   # a value edited
    (lambda arr: arr.update_attributes({"x": 1}), "modified"),              # metadata rewritten
]


@pytest.mark.parametrize("change,word", CHANGED)
def test_resume_refuses_a_changed_input(tmp_path, ab, change, word):
    sa, sb, a, b = ab
    sc = f"{tmp_path / 'c.zarr'}:/C"
    with pytest.raises(errors.Interrupted):
        bigmm.matmul(sa, sb, sc, progress=_stop_after(2), **KW)
    change(zarr.open_array(str(tmp_path / "in.zarr"), path="A", mode="r+"))
    with pytest.raises(errors.ResumeError, match=word) as err:
        bigmm.matmul(sa, sb, sc, resume=True, **KW)
    assert "Nothing was mixed" in str(err.value)


def test_resume_refuses_a_finished_output_whose_contents_changed(tmp_path, ab):
    sa, sb, a, b = ab
    sc = f"{tmp_path / 'c.zarr'}"
    bigmm.matmul(sa, sb, sc, **KW)
    arr = zarr.open_array(sc, mode="r+")
    arr[0, 0] = 99.0
    with pytest.raises(errors.ResumeError, match="contents changed"):
        bigmm.matmul(sa, sb, sc, resume=True, **KW)
    bigmm.matmul(sa, sb, sc, overwrite=True, **KW)
    assert relative_error(_read(sc)[0], a @ b) <= tolerance(np.float64, K)


def _stop_after(n):
    def progress(p):
        if p.tiles_done - p.tiles_skipped >= n:
            raise KeyboardInterrupt
    return progress


# ----- what is refused --------------------------------------------------------------------------

def test_aliases_are_refused(tmp_path, ab):
    sa, sb, a, b = ab
    os.symlink(tmp_path / "in.zarr", tmp_path / "link.zarr")
    root = str(tmp_path / "root.zarr")
    zarr_array(root, a, chunks=(40, 40))
    cases = [
        # (A, output, words): A through a symlink, A's directory as a store of its own, an
        # array inside the root array A (only groups hold nodes)
        (sa, f"{tmp_path / 'link.zarr'}:/A", "same Zarr array"),
        (sa, str(tmp_path / "in.zarr" / "A"), "same Zarr array"),
        (root, f"{root}:/C", "inside the array"),
    ]
    for a_spec, out, words in cases:
        with pytest.raises((errors.OutputIsInputError, errors.OutputNotWritable), match=words):
            bigmm.matmul(a_spec, sb, out, overwrite=True, **KW)
    assert np.array_equal(zarr.open_array(str(tmp_path / "in.zarr"), path="A")[...], a)
    # the whole store that holds the inputs, overwritten as a root array: refused
    zarr.create_array(str(tmp_path / "in.zarr"), name="Z", shape=(M, N), dtype="f8")
    with pytest.raises(errors.OutputNotWritable, match="group"):
        bigmm.matmul(sa, sb, str(tmp_path / "in.zarr"), overwrite=True, **KW)
    # an array that maps an input's raw chunk file, as the output
    a2 = zarr_array(tmp_path / "raw.zarr", a)  # one uncompressed chunk: the raw matrix
    mapped = np.memmap(tmp_path / "raw.zarr" / "c" / "0" / "0", dtype="<f8", mode="r+",
                       shape=(M, N))
    with pytest.raises(errors.OutputIsInputError, match="mapping bytes"):
        bigmm.matmul(a2, sb, mapped, **KW)
    assert np.array_equal(a2[...], a)


def test_spellings_of_one_array_share_its_lock_and_journal(tmp_path, ab):
    # store.zarr:/C and store.zarr/C (the array's own folder) are one output: a run
    # interrupted under one spelling is seen, and resumed, under the other
    sa, sb, a, b = ab
    zarr.create_group(str(tmp_path / "st.zarr"))
    one, other = f"{tmp_path / 'st.zarr'}:/C", str(tmp_path / "st.zarr" / "C")
    with pytest.raises(errors.Interrupted):
        bigmm.matmul(sa, sb, one, progress=_stop_after(2), **KW)
    assert lock_path(parse_spec(one)) == lock_path(parse_spec(other))
    with pytest.raises(errors.OutputExistsError, match="journal"):
        bigmm.matmul(sa, sb, other, overwrite=False, alpha=2.0, **KW)
    _, st = bigmm.matmul(sa, sb, other, resume=True, stats=True, **KW)
    assert 0 < st.tiles_skipped < st.tiles_total
    assert relative_error(_read(one)[0], a @ b) <= tolerance(np.float64, K)


def test_files_inside_a_zarr_output_or_input_are_refused(tmp_path, ab):
    # an HDF5 file or a mapped file inside the Zarr output's directory (which --overwrite would
    # delete), and an HDF5 output inside an input array's directory: refused, nothing removed
    sa, sb, a, b = ab
    out = str(tmp_path / "c.zarr")
    bigmm.matmul(sa, sb, out, **KW)
    with h5py.File(tmp_path / "c.zarr" / "a.h5", "w") as f:
        f["A"] = a
    mapped = np.memmap(tmp_path / "c.zarr" / "c" / "a.bin", np.float64, "w+", shape=a.shape)
    mapped[...] = a
    for a_in in (f"{tmp_path / 'c.zarr' / 'a.h5'}:/A", mapped):
        with pytest.raises(errors.OutputIsInputError, match="nested with"):
            bigmm.matmul(a_in, sb, out, overwrite=True, **KW)
    assert (tmp_path / "c.zarr" / "a.h5").exists() and np.array_equal(mapped, a)
    inside = tmp_path / "in.zarr" / "A" / "c" / "x.h5"
    with pytest.raises(errors.OutputIsInputError, match="nested with"):
        bigmm.matmul(sa, sb, f"{inside}:/C", **KW)
    assert not inside.exists()
    del mapped


def test_one_writer_per_output(tmp_path, ab):
    from bigmm.io.lock import OutputLock

    sa, sb, a, b = ab
    spec = f"{tmp_path / 'c.zarr'}:/C"
    held = OutputLock(lock_path(parse_spec(spec)), "C")  # another run writing C
    with pytest.raises(errors.OutputBusyError, match=f"PID {os.getpid()}"):
        bigmm.matmul(sa, sb, spec, **KW)
    assert not (tmp_path / "c.zarr").exists()  # nothing was created
    held.release()
    bigmm.matmul(sa, sb, spec, **KW)
    assert relative_error(_read(spec)[0], a @ b) <= tolerance(np.float64, K)


OUTPUT_ERRORS = [
    # (what is at the output, spec suffix, error, words)
    ("file", "", errors.OutputNotWritable, "a file"),                 # a file, not a store
    ("group", ":/g", errors.OutputNotWritable, "a group"),            # a group
    ("folder", ":/d", errors.OutputNotWritable, "holds no Zarr"),     # a plain directory
    ("array", ":/X", errors.OutputExistsError, "overwrite"),          # an array already
    ("v2", ":/v", errors.OutputNotWritable, "v2"),                    # a Zarr v2 array
]


@pytest.mark.parametrize("made,suffix,error,words", OUTPUT_ERRORS)
def test_output_places_refused(tmp_path, ab, made, suffix, error, words):
    sa, sb, a, b = ab
    store = tmp_path / "o.zarr"
    if made == "file":
        store.write_text("x")
    else:
        zarr.create_group(str(store)).create_group("g")
        (store / "d").mkdir()
        (store / "d" / "keep.txt").write_text("x")
        zarr.create_array(str(store), name="X", shape=(M, N), dtype="f8")
        zarr.create_array(zarr.storage.LocalStore(str(store / "v")), shape=(M, N), dtype="f8",
                          zarr_format=2)
    for call in (lambda: bigmm.matmul(sa, sb, f"{store}{suffix}", **KW),
                 lambda: generate(f"{store}{suffix}", (4, 4))):  # the same checks for both
        with pytest.raises(error, match=words):
            call()
    if made != "file":
        assert (store / "d" / "keep.txt").read_text() == "x"  # nothing of the user's removed


@pytest.mark.parametrize("overwrite", [False, True])  # an existing array or replacing it
def test_output_through_a_symbolic_link_refused_and_its_target_kept(tmp_path, ab, overwrite):
    sa, sb, a, b = ab
    keep = zarr_array(tmp_path / "keep.zarr", np.full((M, N), 7.0), chunks=(16, 16))
    store = tmp_path / "s.zarr"
    zarr.open_group(str(store), mode="w")
    os.symlink(tmp_path / "keep.zarr", store / "C")  # an array directory that is a link
    os.symlink(tmp_path / "keep.zarr", tmp_path / "lnk.zarr")  # a root store that is one
    for spec in (f"{store}:/C", str(tmp_path / "lnk.zarr")):
        with pytest.raises(errors.OutputNotWritable, match="symbolic link"):
            bigmm.matmul(sa, sb, spec, overwrite=overwrite, **KW)
    assert np.array_equal(keep[...], np.full((M, N), 7.0))  # the linked array untouched
    # an array inside a store reached through a link is its own path: written
    zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    os.symlink(tmp_path / "g.zarr", tmp_path / "lg.zarr")
    bigmm.matmul(sa, sb, f"{tmp_path / 'lg.zarr'}:/C2", **KW)
    assert relative_error(_read(f"{tmp_path / 'g.zarr'}:/C2")[0], a @ b) <= tolerance(
        np.float64, K)


def test_a_new_array_in_a_zarr_v2_group_is_refused_and_the_group_kept(tmp_path, ab):
    sa, sb, a, _ = ab
    store = tmp_path / "v2.zarr"
    zarr.open_group(str(store), mode="w", zarr_format=2).create_array("A", data=a,
                                                                      chunks=(16, 16))
    for call in (lambda: bigmm.matmul(sa, sb, f"{store}:/C", **KW),
                 lambda: bigmm.plan(sa, sb, f"{store}:/C", backend="numpy"),
                 lambda: generate(f"{store}:/X", (4, 4))):
        with pytest.raises(errors.OutputNotWritable, match="Zarr v2 group at"):
            call()
    assert not (store / "zarr.json").exists()  # no v3 metadata hiding the v2 arrays
    assert list(zarr.open_group(str(store), mode="r").keys()) == ["A"]


def test_an_array_written_in_place(tmp_path, ab):
    sa, sb, a, b = ab
    out = zarr_array(tmp_path / "ip.zarr", np.zeros((M, N)), chunks=(48, 32), codec="zstd",
                     attributes={"keep": 1})
    assert bigmm.matmul(sa, sb, out, **KW) is out
    got, attrs, arr = _read(str(tmp_path / "ip.zarr"))
    assert relative_error(got, a @ b) <= tolerance(np.float64, K)
    assert arr.chunks == (48, 32) and arr.compressors  # its own layout kept
    assert attrs["keep"] == 1 and attrs["bigmm_complete"] is True
    with pytest.raises(errors.OptionError, match="partial array"):
        bigmm.matmul(sa, sb, out, beta=1.0, **KW)
    ro = zarr.open_array(str(tmp_path / "ip.zarr"), mode="r")
    with pytest.raises(errors.OutputNotWritable, match="read-only"):
        bigmm.matmul(sa, sb, ro, **KW)


@pytest.mark.parametrize("given", [False, True])  # a new array in chunk files; the caller's
def test_a_finished_output_is_fingerprinted_from_its_tiles(tmp_path, monkeypatch, given):
    # (zstd, big-endian, written through zarr-python) the finished product's fingerprint is
    # taken from the tiles as written, not read back, and a resume reads the same one back
    a = random_matrix((530, 170), np.float64, seed=11)
    b = random_matrix((170, 410), np.float64, seed=12)  # C of 1.7 MB: sampled
    sa = f"{tmp_path / 'in.zarr'}:/A"
    zarr_array(tmp_path / "in.zarr", a, path="A", chunks=(100, 170))
    sb = f"{tmp_path / 'in.zarr'}:/B"
    zarr_array(tmp_path / "in.zarr", b, path="B", chunks=(170, 100))
    sc, out = str(tmp_path / "c.zarr"), str(tmp_path / "c.zarr")
    if given:
        out = zarr_array(sc, np.zeros((530, 410)), chunks=(64, 50), codec="zstd", endian="big")
    kw = dict(memory=900_000, backend="numpy")

    def read_back_instead(self):
        raise AssertionError("the finished output was read back")

    monkeypatch.setattr(ZarrSink, "_fingerprint", read_back_instead)
    bigmm.matmul(sa, sb, out, **kw)
    monkeypatch.undo()
    got, attrs, arr = _read(sc)
    assert relative_error(got, a @ b) <= tolerance(np.float64, 170)
    assert bool(arr.compressors) == given
    with open_input(sc, name="C") as src:
        assert json.loads(attrs["bigmm_job"])["result"] == fingerprint(src)
    _, stats = bigmm.matmul(sa, sb, sc, resume=True, stats=True, **kw)
    assert stats.tiles_done == 0


# ----- regions written by other processes ----------------------------------------------------------

def test_regions_of_whole_chunks(tmp_path, ab):
    sa, sb, a, b = ab
    srcs = [open_input(sa), open_input(sb)]
    spec = f"{tmp_path / 'c.zarr'}"
    data = random_matrix((M, N), np.float64, seed=9)
    with open_output(spec, shape=(M, N), dtype=np.float64, inputs=srcs, job={"plan": "x"},
                     tile=(64, 60)) as sink:
        assert sink.raw_region(0, 64, 0, 30) is None  # cuts a chunk
        tiles = [(i, j, r0, min(M, r0 + 64), c0, min(N, c0 + 60))
                 for i, r0 in enumerate(range(0, M, 64)) for j, c0 in enumerate(range(0, N, 60))]
        for i, j, r0, r1, c0, c1 in tiles:
            where = sink.raw_region(r0, r1, c0, c1)
            with ZarrRegionSink(where) as region:
                h = (r1 - r0) // 2
                region.write(h, r1 - r0, 0, c1 - c0, data[r0 + h:r1, c0:c1])  # any order
                region.write(0, h, 0, c1 - c0, data[r0:r0 + h, c0:c1])
                region.finish()
            sink.commit([(i, j)])
        sink.finish()
    got, attrs, _ = _read(spec)
    assert np.array_equal(got, data) and attrs["bigmm_complete"] and not _leftovers(spec)


def test_an_unfinished_region_is_an_error_and_leaves_nothing(tmp_path, ab):
    sa, sb, a, b = ab
    spec = str(tmp_path / "c.zarr")
    with open_output(spec, shape=(M, N), dtype=np.float64, inputs=[open_input(sa)],
                     job={"plan": "x"}, tile=(64, 60)) as sink:
        with ZarrRegionSink(sink.raw_region(0, 64, 0, 60)) as region:
            region.write(0, 10, 0, 60, np.ones((10, 60)))
            with pytest.raises(errors.WriteError, match="unfinished"):
                region.finish()
    assert not _leftovers(spec) and not (tmp_path / "c.zarr" / "c" / "0" / "0").exists()


# ----- the command line ---------------------------------------------------------------------------

def test_cli_generate_multiply_verify(tmp_path, capsys):
    a, b, c = (str(tmp_path / "s.zarr") + f":/{x}" for x in "ABC")
    assert cli.main(["generate", a, "--shape", "90", "70", "--compression", "gzip",
                     "--chunks", "32", "32", "--seed", "1"]) == 0
    assert "gzip, chunks 32 x 32" in capsys.readouterr().out
    assert cli.main(["generate", b, "--shape", "70", "50", "--seed", "2",
                     "--dtype", "float64"]) == 0
    assert cli.main(["generate", f"{tmp_path / 'h.h5'}:/B", "--shape", "70", "50", "--seed",
                     "2", "--dtype", "float64"]) == 0
    capsys.readouterr()
    # the same seed gives the same matrix in Zarr and HDF5
    with h5py.File(tmp_path / "h.h5", "r") as f:
        assert np.array_equal(f["B"][...], _read(b)[0])
    assert cli.main(["generate", a, "--shape", "9", "9", "--layout", "contiguous"]) == 2
    assert "chunked or compressed" in capsys.readouterr().err
    c64 = str(tmp_path / "s.zarr") + ":/C64"
    assert cli.main(["multiply", a, b, "-o", c64, "--memory", "40KiB", "--backend", "numpy",
                     "--json"]) == 0  # float32 @ float64: float64, as NumPy
    assert json.loads(capsys.readouterr().out)["dtype"] == "float64"
    assert cli.main(["generate", b, "--shape", "70", "50", "--seed", "2", "--overwrite"]) == 0
    capsys.readouterr()
    assert cli.main(["multiply", a, b, "-o", c, "--memory", "40KiB", "--backend", "numpy",
                     "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tiles_done"] > 1
    assert cli.main(["verify", a, b, c]) == 0
    assert "PASSED" in capsys.readouterr().out
    arr = zarr.open_array(str(tmp_path / "s.zarr"), path="C", mode="r+")
    arr[5, 5] = arr[5, 5] + 10
    assert cli.main(["verify", a, b, c]) == 1
