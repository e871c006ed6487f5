"""Shared pytest configuration: tests marked ``gpu`` skip where no usable GPU is present."""

from __future__ import annotations

import os

import pytest

from bigmm.calibration import MODE_ENV
from bigmm.testing import gpu_available

# every test process (and the processes tests start) measures afresh and keeps nothing: the
# store's own tests turn it on in a directory of theirs
os.environ[MODE_ENV] = "off"


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs a usable CUDA GPU and cupy")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)
