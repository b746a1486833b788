"""qkv from Python: the C++ core's tensors, attention op, models and analysis tools.

Arrays cross without copies where the layout allows (numpy's buffer protocol, DLPack for PyTorch);
errors raise qkv.Error with the one-line message the `qkv` command prints.
"""
from ._qkv import *  # noqa: F401,F403
from ._qkv import Error  # noqa: F401
