import pytest

from bigmm.errors import SpecError
from bigmm.io import Spec, parse_spec

GOOD = [
    ("a.h5:/A", "a.h5", "/A"),                      # plain
    ("a.h5:A", "a.h5", "/A"),                       # leading slash optional
    ("dir/a b.h5:/grp/sub/X", "dir/a b.h5", "/grp/sub/X"),  # groups, space in the path
    ("C:/data/a.h5:/A", "C", "/data/a.h5:/A"),      # first ":/" ends the path (documented)
    ("x.hdf5:weird:name", "x.hdf5:weird", "/name"),  # no ":/": the last ":" splits
    ("/abs/a.h5:/A1", "/abs/a.h5", "/A1"),          # absolute path
    ("o.h5:/./g/./C", "o.h5", "/g/C"),              # "." components: one name, one lock
]


@pytest.mark.parametrize("text, path, dataset", GOOD)
def test_parse_spec(text, path, dataset):
    spec = parse_spec(text)
    assert spec == Spec(path, dataset)
    assert str(spec) == f"{path}:{dataset}"
    assert parse_spec(str(spec)) == spec


BAD = [
    "a.h5",        # no dataset
    "a.h5:",       # empty dataset
    "a.h5:/",      # root is not a dataset
    ":/A",         # empty path
    "a.h5:/g//A",  # empty group name
    "a.h5:/g/",    # trailing slash
    "",            # nothing
]


@pytest.mark.parametrize("text", BAD)
def test_parse_spec_rejects(text):
    with pytest.raises(SpecError) as err:
        parse_spec(text)
    assert "Expected 'file.h5:/dataset'" in str(err.value)
    assert repr(text) in str(err.value)


def test_parse_spec_rejects_non_string():
    with pytest.raises(SpecError, match="Got 3 \\(int\\)"):
        parse_spec(3)


def test_paths_are_specs(tmp_path):
    from pathlib import Path

    import numpy as np

    from bigmm.io.generate import generate
    from bigmm.verify import verify
    import bigmm

    assert parse_spec(Path("dir/a.h5:/grp/A")) == Spec("dir/a.h5", "/grp/A")
    a, b, c = (tmp_path / f"m.h5:/{x}" for x in "ABC")
    generate(a, (7, 5), dtype="float64", seed=1)
    generate(b, (5, 3), dtype="float64", seed=2)
    assert bigmm.matmul(a, b, out=c, backend="numpy") == str(c)
    assert verify(a, b, c).passed
    assert bigmm.plan(a, b, backend="numpy").m == 7
    assert np.isfinite(bigmm.matmul(a, b, backend="numpy")).all()


def test_one_output_spelled_with_dots_has_one_lock(tmp_path):
    from bigmm.errors import OutputBusyError
    from bigmm.io.journal import lock_path
    from bigmm.io.lock import OutputLock

    held = OutputLock(lock_path(parse_spec(f"{tmp_path / 'o.h5'}:/C")), "C")
    with pytest.raises(OutputBusyError):  # a second writer spelling it "/./C"
        OutputLock(lock_path(parse_spec(f"{tmp_path / 'o.h5'}:/./C")), "C")
    held.release()


@pytest.mark.parametrize("text", [
    "s.zarr:/../A",      # above the store
    "s.zarr:/g/../A",    # up and down again
    "s.zarr:/..",        # the store's parent
    "s.zarr:/zarr.json",  # the root group's metadata file, made a directory
    "s.zarr:/g/.zarray",  # a v2 metadata name
    "s.zarr:/__A",       # a name the Zarr v3 spec reserves
])
def test_zarr_spec_rejects_parent_and_reserved_names(text):
    with pytest.raises(SpecError, match=r"Expected 'store.zarr:/group/array'.*Got"):
        parse_spec(text)


def test_generate_refuses_a_zarr_path_with_parent_names(tmp_path):
    from bigmm.io.generate import generate

    with pytest.raises(SpecError, match="'..' names"):
        generate(f"{tmp_path / 's.zarr'}:/../x", (3, 4))
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("spec", [
    Spec("a.h5", "/"),           # the root: no dataset
    Spec("", "/A"),              # no file
    Spec("a.h5", "/g//A"),       # an empty group name
    Spec("s.zarr", "/../A", "zarr"),  # above the store
    Spec("a.h5", "/A", "hdf4"),  # a kind bigmm does not read
])
def test_a_spec_made_directly_is_checked(spec):
    with pytest.raises(SpecError, match=r"Expected a Spec .*Got Spec\("):
        parse_spec(spec)


def test_a_spec_made_directly_gets_its_leading_slash():
    assert parse_spec(Spec("a.h5", "A")) == Spec("a.h5", "/A")
    assert parse_spec(Spec("s.zarr", "/", "zarr")) == Spec("s.zarr", "/", "zarr")
