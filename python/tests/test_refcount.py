"""No leak across the crossings: 1e5 round trips numpy -> qkv -> numpy and torch -> qkv -> torch
leave the resident set within a few MB of where a warm-up left it, and the source's reference
count where it started (each round trip's owner handle is released)."""
import gc
import os
import sys

import numpy as np
import pytest

import qkv

# The reference (and half of the sharing) is PyTorch's; scripts/test.sh installs python3-torch.
torch = pytest.importorskip("torch")

ROUNDS = 100_000
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def measure(round_trip, src):
    for _ in range(2000):  # warm-up: allocator pools, pybind11's type caches
        round_trip(src)
    gc.collect()
    refs, rss = sys.getrefcount(src), rss_bytes()
    for _ in range(ROUNDS):
        round_trip(src)
    gc.collect()
    return sys.getrefcount(src) - refs, rss_bytes() - rss


def test_numpy_round_trips_do_not_leak():
    src = np.arange(64, dtype=np.float32)

    def round_trip(a):
        b = qkv.tensor(a).numpy()
        assert b[5] == 5.0

    dref, drss = measure(round_trip, src)
    assert dref == 0
    assert drss < 4 << 20, f"RSS grew {drss / 2**20:.1f} MB over {ROUNDS} round trips"


def test_torch_round_trips_do_not_leak():
    src = torch.arange(64, dtype=torch.float32)

    def round_trip(x):
        y = torch.from_dlpack(qkv.tensor(x))
        assert y[5] == 5.0

    dref, drss = measure(round_trip, src)
    assert dref == 0
    assert drss < 4 << 20, f"RSS grew {drss / 2**20:.1f} MB over {ROUNDS} round trips"
    # torch's own count of users of the storage is back too (each qkv view released its capsule).
    assert sys.getrefcount(src) == 2
