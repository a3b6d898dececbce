"""Inline SVG sparklines for the report's per-module rows: a few hundred of them cost nothing, where a
matplotlib axes each takes a noticeable fraction of a second. Must not import torch or mindspore.
"""

import html
import math

WIDTH, HEIGHT, PAD = 180, 30, 3


def sparkline(steps, values, marked=(), title=""):
    """SVG of `values` over `steps` (lists of equal length); points in `marked` steps as red dots.

    Non-finite values break the line; an all-non-finite series gives an empty frame.
    """
    finite = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
    if hi == lo:
        lo, hi = lo - 1.0, hi + 1.0
    s_lo, s_hi = (min(steps), max(steps)) if steps else (0, 1)
    span = (s_hi - s_lo) or 1

    def xy(step, v):
        x = PAD + (step - s_lo) / span * (WIDTH - 2 * PAD)
        y = HEIGHT - PAD - (v - lo) / (hi - lo) * (HEIGHT - 2 * PAD)
        return f"{x:.1f},{y:.1f}"

    segments, current = [], []
    for step, v in zip(steps, values):
        if isinstance(v, (int, float)) and math.isfinite(v):
            current.append(xy(step, v))
        elif current:
            segments.append(current)
            current = []
    if current:
        segments.append(current)
    parts = [f'<svg class="spark" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}">'
             f"<title>{html.escape(title)}</title>"]
    for seg in segments:
        if len(seg) == 1:
            x, y = seg[0].split(",")
            parts.append(f'<circle cx="{x}" cy="{y}" r="1.5" fill="#1f77b4"/>')
        else:
            parts.append(f'<polyline fill="none" stroke="#1f77b4" stroke-width="1.2" points="{" ".join(seg)}"/>')
    for step, v in zip(steps, values):
        if step in marked:
            y_val = v if isinstance(v, (int, float)) and math.isfinite(v) else hi
            x, y = xy(step, y_val).split(",")
            parts.append(f'<circle class="anomaly-dot" cx="{x}" cy="{y}" r="3" fill="red"/>')
    parts.append("</svg>")
    return "".join(parts)
