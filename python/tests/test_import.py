import pytest

import qkv


def test_error_is_a_runtime_error():
    assert issubclass(qkv.Error, RuntimeError)
