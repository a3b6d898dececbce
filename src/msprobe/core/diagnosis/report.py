"""The printout of a `results.Diagnosis` (what `msprobe compare` prints), and the stack line shown for a call.

Must not import torch or mindspore.
"""
from __future__ import annotations

import math
import os
import re
import sysconfig

from msprobe.core.diagnosis.calls import ARGUMENT, CHECKSUM, DTYPE, NONFINITE, SHAPE
from msprobe.core.diagnosis.diagnosis_json import json_safe
from msprobe.core.diagnosis.results import Diagnosis

_FRAME_RE = re.compile(r"^File (?P<file>.+?), line (?P<line>\d+), in (?P<func>.+?),\s*\n?\s*(?P<code>.*)$", re.S)
# Frames in installed packages (torch, mindspore, ... on any machine) are not the user's code.
_INSTALLED_PARTS = ("/site-packages/", "/dist-packages/", "\\site-packages\\", "\\dist-packages\\")


def _library_dirs():
    """This interpreter's standard library and msprobe's own package directory."""
    paths = sysconfig.get_paths()
    dirs = {os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))}  # .../msprobe
    dirs.update(paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if paths.get(k))
    return tuple(os.path.join(d, "") for d in dirs)


def _is_library(path, library_dirs):
    return any(p in path for p in _INSTALLED_PARTS) or path.startswith(library_dirs)


def stack_line(lines):
    """The innermost frame of user code in a recorded stack (innermost first), as
    'file.py:12 in forward: code', or None."""
    frames = [m for m in (_FRAME_RE.match(str(x).strip()) for x in lines or []) if m]
    if not frames:
        return None
    library_dirs = _library_dirs()
    pick = next((m for m in frames if not _is_library(m["file"], library_dirs)), frames[0])
    code = " ".join(pick["code"].split())
    return f"{pick['file']}:{pick['line']} in {pick['func']}: {code}"


def _num(v, fmt="{:.2e}"):
    v = json_safe(v)  # as diagnosis.json says it: inf and nan as words
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return fmt.format(v)
    return str(v)


def format_diagnosis(d, brief=False):
    """Plain-text report of a `diagnose()` result (or of diagnosis.json's content): everything
    diagnosis.json says, for a terminal.

    The first line stands alone (the verdict; with `brief` it is all there is). Then, for a divergence,
    why, where in the model and in the code, the errors; the ranked suspects; every suspect's evidence
    rows; and notes on precision and on what one side has that the other lacks.
    """
    if not isinstance(d, Diagnosis):
        d = Diagnosis.from_json(d)
    if brief:
        return f"Diagnosis: {d.verdict}."
    lines = [_headline(d)]
    if d.unmatched:
        lines.append(f"  then:    {d.finding}")
    suspects = d.suspects
    if d.divergence:
        top = suspects[0]
        lines.append(f"  why:     {top.reason}")
        if top.module_path:
            lines.append(f"  module:  {' > '.join(top.module_path)}")
        if top.stack:
            lines.append(f"  code:    {top.stack}")
        if d.receiving_ranks:
            recv = d.receiving_ranks
            lines.append(f"  ranks:   {'ranks' if len(recv) > 1 else 'rank'} {', '.join(str(r) for r in recv)} only "
                         f"receive{'' if len(recv) > 1 else 's'} the error from other ranks (collectives, gradient "
                         f"all-reduce)")
        lines.append(f"  errors:  inputs {_num(top.input_error)}, outputs {_num(top.output_error)} "
                     f"(relative; noise floor {_num(_floor_of(top), '{:.2g}')})")
    if suspects:
        title = ("Suspects (where error is introduced, most likely first):" if d.divergence else
                 "Marginal calls (just past what rounding and their inputs explain; not a divergence):")
        lines.append(title)
        lines.append(f"  {'#':>2}  {'call':44s} {'dir':8s} {'kind':13s} {'in err':>9s} {'out err':>9s} "
                     f"{'beyond':>8s}  where")
        for i, s in enumerate(suspects, 1):
            lines.append(f"  {i:>2}  {s.api[:44]:44s} {s.direction:8s} {s.kind:13s} "
                         f"{_num(s.input_error):>9s} {_num(s.output_error):>9s} {_beyond(s):>8s}  "
                         f"{_where(s)} (step {s.step})")
        for i, s in enumerate(suspects, 1):
            lines.extend(_evidence_lines(i, s, d.divergence))
    lines.extend(_notes(d))
    return "\n".join(lines)


def _headline(d):
    if d.unmatched:
        return f"Diagnosis: {d.unmatched}."
    if not d.divergence:
        return f"Diagnosis: {d.verdict}."
    top = d.suspects[0]
    ranks = ",".join(str(r) for r in top.ranks)
    return (f"Diagnosis: divergence. Error is introduced in {top.direction} at {top.api} "
            f"(step {top.step}, {_rank_word(top)} {ranks}).")


def _evidence_lines(i, s, divergence):
    lines = [f"Evidence for #{i} ({s.api}, {s.kind}):"]
    if i > 1 or not divergence:
        lines.append(f"  why:     {s.reason}")
        if s.stack:
            lines.append(f"  code:    {s.stack}")
    rows = [("input", r) for r in s.inputs] + [("output", r) for r in s.outputs]
    if not rows:
        lines.append("  (no tensor of this call was dumped on both sides)")
    for title, r in rows:
        flags = f" [{', '.join(r.flags)}]" if r.flags else ""
        origin = f"  <- {r.origin}" if r.origin else ""
        label = f" {r.diagnosis}" if r.diagnosis else ""
        lines.append(f"  {title:6s}  {short_name(r.name)}:{label} error {_num(r.error)}, {r.target_dtype} vs "
                     f"{r.golden_dtype}{flags}{origin}")
    if s.also_explains:
        lines.append(f"  also explains: {', '.join(s.also_explains)}")
    return lines


def _notes(d):
    lines = []
    precision = d.precision
    if precision.working:
        how = "inferred from the target's dtypes" if precision.inferred else "as given"
        lines.append(f"Precision: the target computes in {precision.working} ({how}); values within its "
                     f"rounding (unit roundoff {precision.unit_roundoff:.2g}) count as agreeing.")
    for p in d.pairs:
        notes = p.structure or {}
        where = f"step {p.step} {'process' if p.is_proc else 'rank'} {p.rank}"
        if p.merge_note:
            lines.append(f"Ranks merged ({where}): {p.merge_note}")
        harmless, other, mispaired, golden_only = (notes.get(k, {}) for k in (
            "extra_harmless", "extra_other", "mispaired", "golden_only"))
        for arg in notes.get("idle_arguments", ()):
            lines.append(f"Structure ({where}): {arg['argument'].replace(' (', ' differs (', 1)} at {arg['count']} "
                         f"call(s), e.g. "
                         f"{', '.join(arg['examples'][:3])}; no value is affected")
        if harmless.get("count"):
            lines.append(f"Structure ({where}): {harmless['count']} extra cast/view/copy call(s) in the target whose "
                         f"values downstream agree (harmless), e.g. {', '.join(harmless['examples'][:3])}")
        if other.get("count"):
            lines.append(f"Structure ({where}): {other['count']} target call(s) without a golden counterpart, "
                         f"e.g. {', '.join(other['examples'][:3])}")
        if mispaired.get("count"):
            lines.append(f"Structure ({where}): {mispaired['count']} cast/view call(s) pair by index with a golden "
                         f"call that works on other values (the two programs lay tensors out differently); "
                         f"treated as unmatched, e.g. {', '.join(mispaired['examples'][:3])}")
        if golden_only.get("count"):
            lines.append(f"Structure ({where}): {golden_only['count']} golden call(s) without a target counterpart, "
                         f"e.g. {', '.join(golden_only['examples'][:3])}")
    cancelled = sum(p.cancelled_rows or 0 for p in d.pairs)
    if cancelled:
        lines.append(f"{cancelled} output(s) cancel to nearly zero (e.g. a bias gradient that is zero in exact "
                     f"arithmetic): their error is judged against their inputs' scale, where it is rounding.")
    propagating = sum(p.propagating_calls for p in d.pairs)
    if propagating:
        lines.append(f"{propagating} other differing call(s) only carry error in from earlier ones.")
    return lines


def _beyond(s):
    """How far past what its inputs and rounding explain the suspect's output is."""
    if s.kind not in _AMPLIFYING_KINDS:
        return "-"
    amp = json_safe(s.amplification)
    return _num(amp, "{:.3g}x") if isinstance(amp, (int, float)) else str(amp)


_AMPLIFYING_KINDS = ("introduced", "amplified")


def _rank_word(suspect):
    if suspect.is_proc:
        return "processes" if len(suspect.ranks) > 1 else "process"
    return "ranks" if len(suspect.ranks) > 1 else "rank"


def _floor_of(suspect):
    floors = [f for f in (json_safe(r.noise_floor) for r in suspect.inputs + suspect.outputs)
              if isinstance(f, (int, float)) and f > 0]
    return max(floors) if floors else 0.0


def short_name(row_name):
    """'Functional.softmax.1.forward.input.0' -> 'input.0'; a parameter gradient's 'parameters_grad.0.bias'."""
    for marker in (".input.", ".output.", ".parameters_grad.", ".parameters."):
        if marker in row_name:
            return marker[1:] + row_name.split(marker, 1)[1]
    return row_name.rsplit(".", 1)[-1]


def describe_row(row):
    """What differs in one row (a `calls.Row`), for a suspect's reason."""
    bits = []
    if DTYPE in row.flags or row.coarser:
        bits.append(f"{row.target_dtype} vs golden {row.golden_dtype}")
    if NONFINITE in row.flags:
        bits.append("inf/nan differ")
    if SHAPE in row.flags:
        bits.append("shape differs")
    if CHECKSUM in row.flags:
        bits.append("checksum differs")
    if ARGUMENT in row.flags:
        bits.append(f"{_value(row.target[0])} vs golden {_value(row.golden[0])}")
    if row.is_tensor and math.isfinite(row.error):
        bits.append(f"relative error {row.error:.2g}")
    return ", ".join(bits)


def _value(v):
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def _where(suspect):
    """'rank 0,1' or, for dumps made without a process group, 'process 4242' (the number is a process id)."""
    return ("process " if suspect.is_proc else "rank ") + ",".join(str(r) for r in suspect.ranks)
