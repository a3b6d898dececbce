"""The table printed at the end of a run: counts of pass/error/skip under both verdicts, the worst
APIs, throughput. Returns text; the CLI prints it. Must not import torch or mindspore.
"""

import math

from msprobe.core.acc_check.verdict import ERROR, PASS, SKIP

SKIPS_LISTED = 100  # skipped APIs named one per line; the rest are counted (all are in the result CSV)


def _count(results, attr):
    counts = {PASS: 0, ERROR: 0, SKIP: 0}
    for r in results:
        statuses = {getattr(r, attr[0]), getattr(r, attr[1])}
        if ERROR in statuses:
            counts[ERROR] += 1
        elif SKIP in statuses and PASS not in statuses:
            counts[SKIP] += 1
        else:
            counts[PASS] += 1
    return counts


def format_summary(report, top=5):
    results = report.results
    seed = _count(results, ("forward", "backward"))
    dtype = _count(results, ("forward_dtype", "backward_dtype"))
    n = len(results)
    checking = report.check_seconds or report.seconds
    rate = n / checking if checking > 0 else math.inf
    lines = [f"acc_check: {n} APIs checked on {report.device} in {report.seconds:.1f} s ({rate:.1f} APIs/s "
             "while checking)"
             + (f", {report.resumed} already done" if report.resumed else ""),
             "",
             f"  {'verdict':<34}{'pass':>7}{'error':>7}{'skip':>7}",
             f"  {'cosine > 0.99 and max abs < 1e-4':<34}{seed[PASS]:>7}{seed[ERROR]:>7}{seed[SKIP]:>7}",
             f"  {'dtype-aware (ULP)':<34}{dtype[PASS]:>7}{dtype[ERROR]:>7}{dtype[SKIP]:>7}"]
    failing = sorted((r for r in results if r.failed and r.worst is not None), key=lambda r: _key(r.worst))
    if failing:
        lines += ["", f"  worst APIs (of {len(failing)} with errors):",
                  f"  {'API':<44}{'output':<18}{'cosine':>10}{'max abs err':>13}{'ULP err':>11}  dtype"]
        for r in failing[:top]:
            w = r.worst
            lines.append(f"  {r.name:<44}{w.api_name[len(r.name) + 1:]:<18}{_g(w.cosine):>10}"
                         f"{_g(w.max_abs_err):>13}{_g(w.ulp_err):>11}  {w.dtype_status}")
    skipped = [r for r in results if r.skipped]
    if skipped:
        lines += ["", "  skipped:"] + [f"    {r.name}: {r.message}" for r in skipped[:SKIPS_LISTED]]
        if len(skipped) > SKIPS_LISTED:
            lines.append(f"    ... and {len(skipped) - SKIPS_LISTED} more (their reasons are in the result CSV)")
        lines.append(f"  {len(skipped)} of {n} APIs skipped")
    lines += ["", f"  result:  {report.result_csv}", f"  details: {report.details_csv}"]
    if report.error_data_dir:
        lines.append(f"  error data: {report.error_data_dir}")
    return "\n".join(lines)


def _key(row):
    cos = row.cosine if isinstance(row.cosine, float) and not math.isnan(row.cosine) else -2.0
    return (cos, -(row.max_abs_err if isinstance(row.max_abs_err, float) else 0.0))


def _g(v):
    try:
        return f"{float(v):.4g}"
    except (TypeError, ValueError):
        return str(v)
