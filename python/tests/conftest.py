"""Shared setup of the Python tests: the build tree's paths (set by ctest, see python/CMakeLists.txt)."""
import os
import pathlib

import pytest

SOURCE_DIR = pathlib.Path(os.environ.get("QKV_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))
BINARY_DIR = pathlib.Path(os.environ.get("QKV_BINARY_DIR", SOURCE_DIR / "build"))


@pytest.fixture
def qkv_cli():
    """The path of the `qkv` command of the same build."""
    return str(BINARY_DIR / "qkv")
