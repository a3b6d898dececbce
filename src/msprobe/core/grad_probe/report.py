"""Write a grad_probe comparison: per-rank similarities.csv, PNG plots, grad_compare.json, console text.

    out/grad_compare.json
    out/rank{R}/similarities.csv                       step, total, one column per parameter
    out/rank{R}/similarities_picture/{param}.png       one parameter over the steps
    out/rank{R}/similarities_picture/summary_similarities.png   the total and every parameter

matplotlib (Agg) is imported only when plots are drawn.
"""

import csv
import json
import math
import os


def _f(v):
    return None if not math.isfinite(v) else round(float(v), 6)


def _safe(name):
    return name.replace(os.sep, "_")


def write_similarities_csv(cmp, path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["step", "total"] + cmp.params)
        for i, s in enumerate(cmp.steps):
            w.writerow([s, _f(cmp.total[i])] + [_f(v) for v in cmp.similarity[i]])


def comparison_json(cmps, threshold, drop):
    ranks = []
    for c in cmps:
        entry = {"rank": c.rank, "steps": c.steps, "first_divergent_step": c.first_divergent_step,
                 "first_different_step": c.first_different_step,
                 "total_similarity": {str(s): _f(t) for s, t in zip(c.steps, c.total)},
                 "param_first_divergent_step": c.param_divergence,
                 "only_in_a": c.only_in_a, "only_in_b": c.only_in_b, "shape_mismatch": c.shape_mismatch}
        if c.first_divergent_step is not None:
            entry["least_similar_at_divergence"] = dict(c.worst_params(c.first_divergent_step))
        ranks.append(entry)
    divergent = [c.first_divergent_step for c in cmps if c.first_divergent_step is not None]
    return {"threshold": threshold, "drop": drop,
            "first_divergent_step": min(divergent) if divergent else None, "ranks": ranks}


def draw_plots(cmp, out_dir, progress=False):
    """One PNG per parameter and summary_similarities.png; returns the number of files written."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    items = list(enumerate(cmp.params))
    if progress:
        from tqdm import tqdm
        items = tqdm(items, desc=f"plots rank {cmp.rank}", unit="param")
    written = 0

    def mark(ax, step):
        if step is not None:
            ax.axvline(step, color="tab:red", linestyle="--", linewidth=1, label=f"diverges at step {step}")

    for j, name in items:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot(cmp.steps, cmp.similarity[:, j], marker="o", markersize=3)
        mark(ax, cmp.param_divergence.get(name))
        ax.set(title=name, xlabel="step", ylabel="sign similarity", ylim=(-0.02, 1.02))
        ax.grid(alpha=0.3)
        if name in cmp.param_divergence:
            ax.legend(loc="lower left")
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, _safe(name) + ".png"), dpi=80)
        plt.close(fig)
        written += 1
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for j in range(len(cmp.params)):
        ax.plot(cmp.steps, cmp.similarity[:, j], color="gray", alpha=0.25, linewidth=0.8)
    ax.plot(cmp.steps, cmp.total, color="tab:blue", linewidth=2, marker="o", markersize=3,
            label="total (element-weighted)")
    mark(ax, cmp.first_divergent_step)
    ax.set(title=f"rank {cmp.rank}: gradient sign similarity", xlabel="step", ylabel="similarity",
           ylim=(-0.02, 1.02))
    ax.grid(alpha=0.3)
    ax.legend(loc="lower left")
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "summary_similarities.png"), dpi=90)
    plt.close(fig)
    return written + 1


def write_comparison(cmps, out_dir, threshold, drop, plots=True, progress=False):
    """Write every output file.

    Returns:
        [(path, count)]: grad_compare.json and each similarities.csv with count 1, each folder of PNG
        plots with the number of plots in it.
    """
    os.makedirs(out_dir, exist_ok=True)
    written = []
    for c in cmps:
        rank_out = os.path.join(out_dir, f"rank{c.rank}")
        write_similarities_csv(c, os.path.join(rank_out, "similarities.csv"))
        written.append((os.path.join(rank_out, "similarities.csv"), 1))
        if plots and c.has_directions:
            picture_dir = os.path.join(rank_out, "similarities_picture")
            written.append((picture_dir, draw_plots(c, picture_dir, progress)))
    path = os.path.join(out_dir, "grad_compare.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(comparison_json(cmps, threshold, drop), f, indent=2)
    return [(path, 1)] + written


def format_comparison(cmps):
    lines = []
    for c in cmps:
        head = f"rank {c.rank}: {len(c.steps)} steps ({c.steps[0]}..{c.steps[-1]}), {len(c.params)} parameters"
        if not c.has_directions:
            head += "; no direction bitmaps (grad_level L0): statistics only"
        lines.append(head)
        if c.first_divergent_step is not None:
            s = c.first_divergent_step
            total = c.total[c.steps.index(s)]
            lines.append(f"  runs diverge at step {s} (total sign similarity {total:.4f})")
            for name, v in c.worst_params(s, 3):
                lines.append(f"    {name}: {v:.4f}")
        else:
            lines.append("  no divergence")
        if c.first_different_step is None:
            lines.append("  gradients identical at every step")
        else:
            lines.append(f"  first step with any difference: {c.first_different_step}")
        for label, names in (("only in a", c.only_in_a), ("only in b", c.only_in_b),
                             ("shape differs", c.shape_mismatch)):
            if names:
                lines.append(f"  {label}: {', '.join(names[:10])}" + (" ..." if len(names) > 10 else ""))
    return "\n".join(lines)
