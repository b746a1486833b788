#!/usr/bin/env python3
"""Log-log plot of attention time against sequence length, one line per pattern, as a standalone SVG.

Usage: bench/plot_attention_scaling.py RESULTS.csv OUT.svg
RESULTS.csv has the columns pattern,n,seconds ('#' lines are comments), e.g. the rows of
`qkv bench --what attention --pattern P --json` (n, ms / 1000). Each legend entry carries the
least-squares slope of log(seconds) over log(n): 2 is quadratic, 1 linear. Standard library only.
"""
import csv
import math
import sys

W, H, L, R, T, B = 760, 460, 70, 250, 20, 50
COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]


def slope(points):
    xs = [math.log(n) for n, _ in points]
    ys = [math.log(s) for _, s in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else float("nan")


def main(src, out):
    series = {}
    with open(src) as f:
        for row in csv.DictReader(line for line in f if not line.startswith("#")):
            series.setdefault(row["pattern"], []).append((int(row["n"]), float(row["seconds"])))
    if not series:
        sys.exit(f"{src}: no rows (columns pattern,n,seconds)")
    ns = [n for pts in series.values() for n, _ in pts]
    ss = [s for pts in series.values() for _, s in pts]
    x0, x1 = math.log2(min(ns)), math.log2(max(ns))
    y0, y1 = math.floor(math.log10(min(ss))), math.ceil(math.log10(max(ss)))
    px = lambda n: L + (math.log2(n) - x0) / max(x1 - x0, 1e-9) * (W - L - R)
    py = lambda s: H - B - (math.log10(s) - y0) / max(y1 - y0, 1e-9) * (H - T - B)
    el = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
          f'<rect width="{W}" height="{H}" fill="white"/>']
    for e in range(int(x0), int(x1) + 1):
        x = px(2 ** e)
        el.append(f'<line x1="{x:.1f}" y1="{T}" x2="{x:.1f}" y2="{H - B}" stroke="#ddd"/>')
        el.append(f'<text x="{x:.1f}" y="{H - B + 16}" text-anchor="middle">{2 ** e // 1024}K</text>')
    for e in range(y0, y1 + 1):
        y = py(10 ** e)
        el.append(f'<line x1="{L}" y1="{y:.1f}" x2="{W - R}" y2="{y:.1f}" stroke="#ddd"/>')
        el.append(f'<text x="{L - 6}" y="{y + 4:.1f}" text-anchor="end">{10.0 ** e:g} s</text>')
    el.append(f'<text x="{(L + W - R) / 2}" y="{H - 12}" text-anchor="middle">sequence length N (log scale)</text>')
    el.append(f'<text x="16" y="{(T + H - B) / 2}" text-anchor="middle" transform="rotate(-90 16 {(T + H - B) / 2})">'
              'forward + backward time (log scale)</text>')
    for k, (name, pts) in enumerate(series.items()):
        pts.sort()
        c = COLORS[k % len(COLORS)]
        path = " ".join(f"{px(n):.1f},{py(s):.1f}" for n, s in pts)
        el.append(f'<polyline points="{path}" fill="none" stroke="{c}" stroke-width="2"/>')
        el += [f'<circle cx="{px(n):.1f}" cy="{py(s):.1f}" r="3" fill="{c}"/>' for n, s in pts]
        ly = T + 14 + 20 * k
        el.append(f'<line x1="{W - R + 12}" y1="{ly - 4}" x2="{W - R + 32}" y2="{ly - 4}" stroke="{c}" stroke-width="2"/>')
        el.append(f'<text x="{W - R + 38}" y="{ly}">{name} (slope {slope(pts):.2f})</text>')
    el.append("</svg>")
    with open(out, "w") as f:
        f.write("\n".join(el) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
