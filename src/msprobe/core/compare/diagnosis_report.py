"""Text rendering of a diagnosis (what `msprobe compare` prints), and the stack line shown for a call.

Must not import torch or mindspore.
"""
from __future__ import annotations

import os
import re
import sysconfig

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
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return fmt.format(v)
    return str(v)


def format_diagnosis(d):
    """Plain-text report of a `diagnose()` result. The first lines stand alone (verdict, reason, module,
    code line, errors); the ranking and the evidence rows follow."""
    if not d["divergence"]:
        lines = [f"Diagnosis: {d['verdict']}."]
        for s in d["suspects"][:5]:  # only marginal ones when there is no divergence
            worst = max((e for e in (s["input_error"], s["output_error"]) if isinstance(e, (int, float))), default=0)
            lines.append(f"  {s['api']} ({s['direction']}, step {s['step']}): error {_num(worst)}")
        unmatched = sum(r.get("unmatched_calls", 0) for r in d["ranks"])
        if unmatched:
            lines.append(f"  ({unmatched} call(s) of the target have no counterpart in golden.)")
        return "\n".join(lines)
    top = d["suspects"][0]
    ranks = ",".join(str(r) for r in top["ranks"])
    lines = [f"Diagnosis: divergence. Error is introduced in {top['direction']} at {top['api']} "
             f"(step {top['step']}, {_rank_word(top)} {ranks}).",
             f"  why:     {top['reason']}"]
    if top.get("module_path"):
        lines.append(f"  module:  {' > '.join(top['module_path'])}")
    if top.get("stack"):
        lines.append(f"  code:    {top['stack']}")
    if d.get("receiving_ranks"):
        recv = d["receiving_ranks"]
        lines.append(f"  ranks:   {'ranks' if len(recv) > 1 else 'rank'} {', '.join(str(r) for r in recv)} only "
                     f"receive{'' if len(recv) > 1 else 's'} the error from other ranks (collectives, gradient "
                     f"all-reduce)")
    lines.append(f"  errors:  inputs {_num(top['input_error'])}, outputs {_num(top['output_error'])} "
                 f"(relative; noise floor {_num(_floor_of(top), '{:.2g}')})")
    lines.append("Suspects (where error is introduced, most likely first):")
    lines.append(f"  {'#':>2}  {'call':44s} {'dir':8s} {'kind':13s} {'in err':>9s} {'out err':>9s} "
                 f"{'amplif.':>8s}  where")
    for i, s in enumerate(d["suspects"][:10], 1):
        if s["kind"] not in _AMPLIFYING_KINDS:
            amp = "-"
        elif s["input_error"] == 0:
            amp = "new"  # exact inputs: no ratio to show
        else:
            amp = _num(s["amplification"], "{:.3g}")
        lines.append(f"  {i:>2}  {s['api'][:44]:44s} {s['direction']:8s} {s['kind']:13s} "
                     f"{_num(s['input_error']):>9s} {_num(s['output_error']):>9s} {amp:>8s}  "
                     f"{_where(s)} (step {s['step']})")
    if len(d["suspects"]) > 10:
        lines.append(f"  ... {len(d['suspects']) - 10} more in diagnosis.json")
    lines.append(f"Evidence for #1 ({top['api']}):")
    for title, rows in (("input", top["inputs"]), ("output", top["outputs"])):
        for r in rows[:4]:
            flags = f" [{', '.join(r['flags'])}]" if r["flags"] else ""
            origin = f"  <- {r['origin']}" if r.get("origin") else ""
            lines.append(f"  {title:6s}  {_tail(r['name'])}: error {_num(r['error'])}, {r['target_dtype']} vs "
                         f"{r['golden_dtype']}{flags}{origin}")
    propagating = sum(r.get("propagating_calls", 0) for r in d["ranks"])
    if propagating:
        lines.append(f"{propagating} other diverging call(s) only carry error in from earlier ones.")
    return "\n".join(lines)


_AMPLIFYING_KINDS = ("introduced", "amplified", "overflow")


def _rank_word(suspect):
    word = "process" if suspect.get("is_proc") else "rank"
    return word + ("s" if len(suspect["ranks"]) > 1 else "")


def _floor_of(suspect):
    floors = [r["noise_floor"] for r in suspect["inputs"] + suspect["outputs"]
              if isinstance(r.get("noise_floor"), (int, float)) and r["noise_floor"] > 0]
    return max(floors) if floors else 0.0


def _tail(name):
    for marker in (".input.", ".output.", ".parameters."):
        if marker in name:
            return marker[1:] + name.split(marker, 1)[1]
    return name


def _capital(text):
    return text[:1].upper() + text[1:]


def _where(suspect):
    """'rank 0,1' or, for dumps made without a process group, 'proc 4242' (the number is a process id)."""
    return ("proc " if suspect.get("is_proc") else "rank ") + ",".join(str(r) for r in suspect["ranks"])
