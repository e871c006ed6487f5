"""Shared pytest configuration: tests marked ``gpu`` skip where no usable GPU is present."""

from __future__ import annotations

import pytest

from bigmm.testing import gpu_available


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs a usable CUDA GPU and cupy")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)
