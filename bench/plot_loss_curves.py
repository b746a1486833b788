#!/usr/bin/env python3
"""Training and validation loss against step, one colour per run, as a standalone SVG.

Usage: bench/plot_loss_curves.py OUT.svg LABEL=RUN_DIR/metrics.jsonl [LABEL=...] [--title TEXT]
Each metrics.jsonl line is a JSON object with at least "step" and "loss"; lines that also carry
"val_loss" give the validation curve. Training loss is drawn thin, validation loss thicker with
point markers in the same colour; each legend entry carries the run's last val_loss. A missing
file, a line that is not JSON or lacks "step"/"loss", or an argument without '=' is rejected with
exit status 2. Standard library only.
"""
import html
import json
import math
import sys

W, H, L, R, T, B = 860, 480, 70, 270, 44, 50
COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
DEFAULT_TITLE = "training and validation loss"


def fail(msg):
    print(f"plot_loss_curves.py: {msg}", file=sys.stderr)
    sys.exit(2)


def load(path):
    train, val = [], []
    try:
        f = open(path)
    except OSError as e:
        fail(f"{path}: {e.strerror}")
    with f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                fail(f"{path}:{lineno}: not a JSON line")
            if not isinstance(rec, dict) or not all(isinstance(rec.get(k), (int, float)) for k in ("step", "loss")):
                fail(f'{path}:{lineno}: needs numeric "step" and "loss"')
            train.append((rec["step"], rec["loss"]))
            if isinstance(rec.get("val_loss"), (int, float)):
                val.append((rec["step"], rec["val_loss"]))
    keep = lambda pts: sorted(p for p in pts if math.isfinite(p[0]) and math.isfinite(p[1]))
    train, val = keep(train), keep(val)
    if not train:
        fail(f"{path}: no records")
    return train, val


def ticks(lo, hi, n=6):
    """Round tick positions covering [lo, hi] with about n intervals; returns (first, last, step)."""
    raw = max(hi - lo, 1e-12) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    return math.floor(lo / step) * step, math.ceil(hi / step) * step, step


def main(out, runs, title):
    data = [(label, *load(path)) for label, path in runs]
    xs = [s for _, tr, va in data for s, _ in tr + va]
    ys = [v for _, tr, va in data for _, v in tr + va]
    x0, x1, dx = ticks(min(0, min(xs)), max(xs))
    y0, y1, dy = ticks(min(ys), max(ys))
    px = lambda s: L + (s - x0) / max(x1 - x0, 1e-12) * (W - L - R)
    py = lambda v: H - B - (v - y0) / max(y1 - y0, 1e-12) * (H - T - B)
    fmt = lambda v, d: f"{v:.{len(f'{d:.10f}'.rstrip('0').partition('.')[2])}f}"
    el = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
          f'<rect width="{W}" height="{H}" fill="white"/>',
          f'<text x="{W / 2}" y="{T - 18}" text-anchor="middle" font-size="14">{html.escape(title)}</text>']
    for k in range(round((x1 - x0) / dx) + 1):
        x = px(x0 + k * dx)
        el.append(f'<line x1="{x:.1f}" y1="{T}" x2="{x:.1f}" y2="{H - B}" stroke="#ddd"/>')
        el.append(f'<text x="{x:.1f}" y="{H - B + 16}" text-anchor="middle">{fmt(x0 + k * dx, dx)}</text>')
    for k in range(round((y1 - y0) / dy) + 1):
        y = py(y0 + k * dy)
        el.append(f'<line x1="{L}" y1="{y:.1f}" x2="{W - R}" y2="{y:.1f}" stroke="#ddd"/>')
        el.append(f'<text x="{L - 6}" y="{y + 4:.1f}" text-anchor="end">{fmt(y0 + k * dy, dy)}</text>')
    el.append(f'<rect x="{L}" y="{T}" width="{W - L - R}" height="{H - T - B}" fill="none" stroke="#888"/>')
    el.append(f'<text x="{(L + W - R) / 2}" y="{H - 12}" text-anchor="middle">step</text>')
    el.append(f'<text x="16" y="{(T + H - B) / 2}" text-anchor="middle" transform="rotate(-90 16 {(T + H - B) / 2})">loss</text>')
    for k, (label, train, val) in enumerate(data):
        c = COLORS[k % len(COLORS)]
        line = lambda pts: " ".join(f"{px(s):.1f},{py(v):.1f}" for s, v in pts)
        el.append(f'<polyline points="{line(train)}" fill="none" stroke="{c}" stroke-width="1" stroke-opacity="0.8"/>')
        if val:
            el.append(f'<polyline points="{line(val)}" fill="none" stroke="{c}" stroke-width="2.5"/>')
            el += [f'<circle cx="{px(s):.1f}" cy="{py(v):.1f}" r="3" fill="{c}"/>' for s, v in val]
        ly = T + 14 + 20 * k
        final = f"final val {val[-1][1]:.4f}" if val else "no val_loss"
        el.append(f'<line x1="{W - R + 12}" y1="{ly - 4}" x2="{W - R + 32}" y2="{ly - 4}" stroke="{c}" stroke-width="2.5"/>')
        el.append(f'<text x="{W - R + 38}" y="{ly}">{html.escape(label)} ({final})</text>')
    ly = T + 14 + 20 * len(data) + 10
    el.append(f'<line x1="{W - R + 12}" y1="{ly - 4}" x2="{W - R + 32}" y2="{ly - 4}" stroke="#555" stroke-width="1"/>')
    el.append(f'<text x="{W - R + 38}" y="{ly}">thin: training loss</text>')
    el.append(f'<line x1="{W - R + 12}" y1="{ly + 16}" x2="{W - R + 32}" y2="{ly + 16}" stroke="#555" stroke-width="2.5"/>')
    el.append(f'<circle cx="{W - R + 22}" cy="{ly + 16}" r="3" fill="#555"/>')
    el.append(f'<text x="{W - R + 38}" y="{ly + 20}">thick + dots: validation loss</text>')
    el.append("</svg>")
    with open(out, "w") as f:
        f.write("\n".join(el) + "\n")


if __name__ == "__main__":
    args, title = sys.argv[1:], DEFAULT_TITLE
    if "--title" in args:
        i = args.index("--title")
        if i + 1 >= len(args):
            fail("--title needs a value")
        title = args[i + 1]
        del args[i:i + 2]
    if len(args) < 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    runs = []
    for a in args[1:]:
        if "=" not in a:
            fail(f"argument {a!r} is not LABEL=PATH")
        runs.append(tuple(a.split("=", 1)))
    main(args[0], runs, title)
