"""`msprobe monitor_report`: PNG charts and one HTML page of per-module trends from a monitor dir, with
the anomalies marked. Must not import torch or mindspore; pandas and matplotlib (Agg) are imported here.

Per rank and data type (`actv`, `grad_reduced`, ...): one PNG trend chart with a panel per op and a line
per module or parameter (anomalies as red crosses), and a table with a row per module or parameter and
an inline SVG sparkline per op (anomalies as red dots).
Rows of several micro steps are averaged per step.
"""

import html
import os
from dataclasses import dataclass, field
from typing import List

from msprobe.core.monitor.ops import OPS, chosen_ops
from msprobe.core.monitor.reader import anomaly_point, load_anomalies, load_monitor_dir
from msprobe.core.monitor.sparkline import sparkline
from msprobe.core.safe_files import make_dirs, open_text

LEGEND_MAX = 12
ANOMALY_ROWS = 500   # rows of the anomaly table (the first ones in time order)
STEPS_LISTED = 20    # steps named in the anomaly summary line
TAG_ORDER = ("actv", "actv_grad", "grad_unreduced", "grad_reduced", "exp_avg", "exp_avg_sq", "param_origin",
             "param_updated")


@dataclass
class ReportResult:
    """What `build_report` wrote."""

    html_path: str
    png_paths: List[str] = field(default_factory=list)
    rows: int = 0
    anomalies: int = 0


def _slug(text):
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)


def _tag_key(tag):
    return (TAG_ORDER.index(tag), tag) if tag in TAG_ORDER else (len(TAG_ORDER), tag)


def _anomaly_index(records):
    """{(rank, tag, name, op): set(steps)}; op None marks every op of that series."""
    index = {}
    for rec in records:
        point = anomaly_point(rec)
        if point:
            rank, tag, name, step, op = point
            index.setdefault((rank, tag, name, op), set()).add(step)
    return index


def _marked_steps(index, rank, tag, name, op):
    return index.get((rank, tag, name, op), set()) | index.get((rank, tag, name, None), set())


def _draw_series(ax, series, op, anomalies, rank, tag, legend):
    from matplotlib.ticker import MaxNLocator

    ranked = sorted(series.items(), key=lambda kv: -abs(kv[1].iloc[-1]) if len(kv[1]) else 0)
    marked_any = False
    for i, (name, s) in enumerate(ranked):
        top = i < LEGEND_MAX
        ax.plot(s.index, s.values, linewidth=1.2 if top else 0.6, alpha=1.0 if top else 0.5,
                marker="o" if len(s) <= 20 else None, markersize=3,
                label=(name or "(model)") if top and legend else None)
        steps = [st for st in _marked_steps(anomalies, rank, tag, name, op) if st in s.index]
        if steps:
            marked_any = True
            ax.scatter(steps, s.loc[steps].values, marker="x", s=70, color="red", zorder=5, linewidths=2)
    if marked_any and legend:
        ax.scatter([], [], marker="x", color="red", label="anomaly")
    ax.set_ylabel(op)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if op == "norm" and series and all((s.dropna() > 0).all() for s in series.values()):
        ax.set_yscale("log")
    ax.grid(alpha=0.3)


def _trend_chart(plt, series_by_op, anomalies, rank, tag, title, path):
    """One panel per op, a line per module/parameter (the largest LEGEND_MAX named), anomalies as red x."""
    ops = list(series_by_op)
    fig, axes = plt.subplots(len(ops), 1, figsize=(10, 2.4 * len(ops) + 0.8), sharex=True, squeeze=False)
    for i, (ax, op) in enumerate(zip(axes[:, 0], ops)):
        _draw_series(ax, series_by_op[op], op, anomalies, rank, tag, legend=i == 0)
    axes[0, 0].set_title(title)
    axes[0, 0].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    axes[-1, 0].set_xlabel("step")
    fig.subplots_adjust(left=0.08, right=0.72, top=0.95, bottom=0.08, hspace=0.15)
    with open_text(path, "wb") as f:
        fig.savefig(f, format="png", dpi=72)
    plt.close(fig)


def build_report(input_dir, output_dir, ops=None, show_progress=True):
    """Write `output_dir/index.html` and `output_dir/png/*.png` for the monitor data in `input_dir`.

    Args:
        input_dir: monitor output root or one rank dir.
        output_dir: created if missing.
        ops: ops to chart (default: every op present in the data).
        show_progress: tqdm bar over the charts.

    Returns:
        ReportResult

    Raises:
        DumpFormatError: no monitor data in `input_dir`; ConfigError: an op not in `ops.OPS`.
    """
    if ops:  # none or empty: every op present
        ops = chosen_ops(ops)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from tqdm import tqdm
    df = load_monitor_dir(input_dir)
    records = load_anomalies(input_dir)
    anomalies = _anomaly_index(records)
    present = [op for op in OPS if op in df.columns and df[op].notna().any()]
    ops = [op for op in (ops or present) if op in present]
    png_dir = os.path.join(output_dir, "png")
    make_dirs(png_dir)
    result = ReportResult(os.path.join(output_dir, "index.html"), rows=len(df), anomalies=len(records))

    groups = sorted(df.groupby(["rank", "tag"]), key=lambda kv: (kv[0][0], _tag_key(kv[0][1])))
    jobs = []
    for (rank, tag), g in groups:
        per_step = g.groupby(["name", "step"])[ops].mean()
        names = list(dict.fromkeys(g["name"]))
        series = {op: {n: per_step.loc[n][op] for n in names if n in per_step.index.get_level_values(0)}
                  for op in ops}
        jobs.append(("trend", rank, tag, None, series, None))
    sections = {}
    for kind, rank, tag, op, series, part in tqdm(jobs, desc="monitor_report charts", unit="chart",
                                                  disable=not show_progress):
        fname = _slug(f"rank{rank}_{tag}_trend.png")
        _trend_chart(plt, series, anomalies, rank, tag, f"rank {rank} · {tag}", os.path.join(png_dir, fname))
        result.png_paths.append(os.path.join(png_dir, fname))
        sections.setdefault((rank, tag), []).append((kind, op, fname))

    with open_text(result.html_path) as f:
        f.write(_html(df, ops, records, anomalies, sections, input_dir))
    return result


def _module_table(g, ops, anomalies, rank, tag):
    """One row per module/parameter: a sparkline per op (anomalies as red dots), first/last/max of the first op."""
    per_step = g.groupby(["name", "step"])[ops].mean()
    head = "".join(f"<th>{_e(op)} trend</th>" for op in ops)
    out = [f"<table><tr><th>name</th>{head}<th>steps</th><th>{_e(ops[0])} first</th><th>{_e(ops[0])} last</th>"
           f"<th>{_e(ops[0])} max</th><th>anomaly steps</th></tr>"]
    for name in dict.fromkeys(g["name"]):
        s = per_step.loc[name]
        steps = [int(x) for x in s.index]
        cells = []
        for op in ops:
            marked = _marked_steps(anomalies, rank, tag, name, op) | _marked_steps(anomalies, rank, tag, name, None)
            cells.append("<td>" + sparkline(steps, s[op].tolist(), marked, f"{name or '(model)'} {op}") + "</td>")
        marked = sorted(set().union(*[_marked_steps(anomalies, rank, tag, name, o) for o in ops + [None]]))
        cls = ' class="bad"' if marked else ""
        first = s[ops[0]]
        out.append(f"<tr{cls}><td>{_e(name or '(model)')}</td>{''.join(cells)}"
                   f"<td>{_e(steps[0])}–{_e(steps[-1])}</td><td>{first.iloc[0]:.6g}</td><td>{first.iloc[-1]:.6g}</td>"
                   f"<td>{first.max():.6g}</td><td>{_e(', '.join(map(str, marked)) or '-')}</td></tr>")
    out.append("</table>")
    return "\n".join(out)


def time_order(records):
    """Anomaly records in the order they happened: by step, then by call within the step (`call_id`: our
    rows come in hook order, msProbe's count the calls), then by rank."""
    return sorted(records, key=lambda r: tuple(_order(r.get(k, 0)) for k in ("step", "call_id", "rank")))


def _order(value):
    """A sort key for a number a file gave, whatever its type (numbers first, then the rest as text)."""
    return (0, value, "") if isinstance(value, (int, float)) and not isinstance(value, bool) else (1, 0, str(value))


def _e(value):
    """Text from a file, as HTML text: every string that came from a file goes through here."""
    return html.escape(str(value))


def _anomaly_section(records):
    """The page's first section: the first anomaly in words, the steps that had any, then the records
    in time order (the first ANOMALY_ROWS)."""
    if not records:
        return ["<p>No anomalies recorded.</p>"]
    ordered = time_order(records)
    first = ordered[0]
    per_step = {}
    for rec in ordered:
        per_step[rec.get("step")] = per_step.get(rec.get("step"), 0) + 1
    steps = ", ".join(f"{_e(step)} ({n})" for step, n in list(per_step.items())[:STEPS_LISTED])
    more = f", ... {len(per_step) - STEPS_LISTED} more steps" if len(per_step) > STEPS_LISTED else ""
    parts = [f"<p class='anomaly' id='first-anomaly'>First anomaly: step {_e(first.get('step'))}, rank "
             f"{_e(first.get('rank'))}: {_e(first.get('message'))}</p>",
             f"<p>Steps with anomalies (count): {steps}{more}</p>",
             "<table><tr><th>step</th><th>rank</th><th>series</th><th>message</th></tr>"]
    for rec in ordered[:ANOMALY_ROWS]:
        parts.append(f"<tr class='bad'><td>{_e(rec.get('step'))}</td><td>{_e(rec.get('rank'))}</td>"
                     f"<td>{_e(rec.get('tag_name'))}</td><td class='anomaly'>{_e(rec.get('message'))}</td></tr>")
    parts.append("</table>")
    if len(records) > ANOMALY_ROWS:
        parts.append(f"<p>... and {len(records) - ANOMALY_ROWS} later ones in anomaly_detected/*.json</p>")
    return parts


def _html(df, ops, records, anomalies, sections, input_dir):
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>msprobe monitor report</title><style>"
        "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:13px;margin:1em 0}"
        "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}td:first-child{text-align:left}"
        "tr.bad{background:#ffe0e0}img{max-width:100%;border:1px solid #ddd;margin:4px 0}"
        "h2{border-bottom:1px solid #888}.anomaly{color:#b00}svg.spark{display:block}</style></head><body>",
        "<h1>msprobe monitor report</h1>",
        f"<p>source: <code>{_e(os.path.abspath(input_dir))}</code> · ranks "
        f"{_e(', '.join(map(str, sorted(df['rank'].unique()))))} · steps {_e(df['step'].min())}–"
        f"{_e(df['step'].max())} · {len(df)} rows · ops {_e(', '.join(ops))}</p>",
        f"<h2 id='anomalies'>Anomalies ({len(records)})</h2>",
    ]
    parts += _anomaly_section(records)
    for (rank, tag), items in sections.items():
        parts.append(f"<h2 id='rank{_e(rank)}-{_e(tag)}'>rank {_e(rank)} · {_e(tag)}</h2>")
        for kind, op, fname in items:
            alt = f"{tag} trend of {', '.join(ops)}"
            parts.append(f"<img src='png/{_e(fname)}' alt='{_e(alt)}'>")
        g = df[(df["rank"] == rank) & (df["tag"] == tag)]
        parts.append(_module_table(g, ops, anomalies, rank, tag))
    parts.append("</body></html>")
    return "\n".join(parts)
