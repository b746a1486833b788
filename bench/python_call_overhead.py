"""The cost of calling qkv.attention from Python: the same call timed in a Python loop and in a C++
loop (qkv._qkv._time_attention, the op alone, without the GIL), on a small shape where the call's
fixed costs show. Rounds alternate the two so that machine load hits both alike; the figure is
median(Python) - median(C++) per call.

  PYTHONPATH=build/python /usr/bin/python3 bench/python_call_overhead.py [--rounds 15] [--iters 2000]
"""
import argparse
import statistics
import time

import numpy as np

import qkv
from qkv import _qkv


def python_loop(q, k, v, iters, opts):
    attention = qkv.attention
    t0 = time.perf_counter()
    for _ in range(iters):
        attention(q, k, v, **opts)
    return (time.perf_counter() - t0) / iters


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--shape", type=int, nargs=4, default=[1, 2, 16, 16], metavar=("B", "H", "N", "D"))
    args = ap.parse_args()
    b, h, n, d = args.shape
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((b, h, n, d)).astype(np.float32) for _ in range(3)]
    tensors = [qkv.tensor(a) for a in arrays]
    print(f"attention [{b},{h},{n},{d}] float32, {args.rounds} alternated rounds of {args.iters} calls")
    for label, inputs, opts in [
        ("qkv.Tensor inputs, no options", tensors, {}),
        ("qkv.Tensor inputs, causal=True", tensors, {"causal": True}),
        ("numpy inputs, causal=True", arrays, {"causal": True}),
    ]:
        python_loop(*inputs, 200, opts)  # warm-up
        _qkv._time_attention(*inputs, 200, **opts)
        py, cpp = [], []
        for _ in range(args.rounds):
            py.append(python_loop(*inputs, args.iters, opts))
            cpp.append(_qkv._time_attention(*inputs, args.iters, **opts))
        mp, mc = statistics.median(py), statistics.median(cpp)
        print(f"  {label:34s} python {mp * 1e6:8.2f} us   C++ {mc * 1e6:8.2f} us   overhead {(mp - mc) * 1e6:6.2f} us/call")


if __name__ == "__main__":
    main()
