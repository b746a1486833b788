"""qkv from Python: the C++ core's tensors, attention op, models and analysis tools.

Arrays cross without copies where the layout allows (numpy's buffer protocol, DLPack for PyTorch);
errors raise qkv.Error with the one-line message the `qkv` command prints.
"""
import os as _os

# libgomp reads its barrier wait policy once, when it is loaded (importing _qkv loads it), and by
# default spins ~300k iterations before sleeping, which on busy cores burns the time slices of the
# threads a barrier waits for: the `qkv` command runs with GOMP_SPINCOUNT=1000 for this reason
# (app/main.cpp), and so does the module, unless the user chose a policy or something imported
# earlier (torch) has already loaded libgomp.
def _libgomp_loaded():
    try:
        with open("/proc/self/maps") as maps:
            return any("libgomp" in line for line in maps)
    except OSError:
        return False


if "OMP_WAIT_POLICY" not in _os.environ and "GOMP_SPINCOUNT" not in _os.environ:
    if _libgomp_loaded():
        import warnings as _warnings
        _warnings.warn("qkv: libgomp was loaded before qkv (by torch?) with its default busy-wait; on busy cores "
                       "training runs slower (a step up to 2x). Import qkv first, or set GOMP_SPINCOUNT=1000 in "
                       "the environment", RuntimeWarning, stacklevel=2)
    _os.environ["GOMP_SPINCOUNT"] = "1000"

from ._qkv import *  # noqa: E402,F401,F403
from ._qkv import Error, __version__  # noqa: E402,F401
