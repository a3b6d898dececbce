"""Sharded run vs single-device run: the records of one step's N rank dirs merged into the records of one
whole-model run, which compare then matches against the single-device dump as usual.

Per tensor (same key and position on every rank):
- a DTensor record (its `shard` field: placements, offset, local shape; pytorch/tensor_subclasses.py):
  the distinct shards (replicas share an offset) merged into whole-tensor statistics — max of maxes,
  min of mins, element-weighted mean, root of summed squared norms; a Partial placement (values still
  to be summed) has no statistics of the whole;
- a plain tensor (a tensor-parallel rank's local activation, a data-parallel rank's batch): concatenated
  along the one dimension where the ranks' shapes differ, or where the golden run's shape is their sum;
  the same shape as the golden's on every rank: replicated, rank 0's record;
- data parallel (the ranks split the batch: the first tensor concatenated in forward is along dim 0, or
  ranks hold different values of a tensor shaped as golden's): a value each rank reduced over its own part
  of the batch (a one-element value such as its mean loss, a local weight gradient) is merged as the mean of the ranks' values weighted
  by their rows (exact Mean; Max/Min/Norm only for one-element tensors), and the pieces of a backward
  record (activation gradients, each rank's scaled by its 1/rows) by their share of the rows. This holds
  for losses that are means over the batch; `ShardMerge.note` says what was assumed;
- anything else: rank 0's value.
In tensor mode the shards' files are assembled into one .npy per tensor (placed at their offsets,
Partial pieces summed), written to `out_dir`. Must not import torch or mindspore.
"""
from __future__ import annotations

import math
import os

import numpy as np

_STATS = ("Max", "Min", "Mean", "Norm")


def load_sharded_sides(target, golden, scratch):
    """((reader, rows), (reader, rows)) of a target and a golden side, either of which may be a tuple of
    rank dirs to merge; the merged side's reader is its first rank's, holding the merged records.
    `scratch`: a folder for the assembled tensors of tensor mode."""
    from msprobe.core.compare.rows import frame_from_records
    from msprobe.core.compare.tensor_mode import tensor_dir
    from msprobe.core.dump.reader import DumpReader
    from msprobe.core.gc_pause import CollectorPause

    with CollectorPause():
        single = DumpReader(golden if isinstance(target, tuple) else target)
        readers = [DumpReader(p) for p in (target if isinstance(target, tuple) else golden)]
        tensors = readers[0].task == "tensor"
        merge = ShardMerge([tensor_dir(r) for r in readers] if tensors else None, scratch if tensors else None,
                           hint=single.data)
        merged = readers[0]
        merged.data = merge.merge([r.data for r in readers])
        merged.merge_note, merged.merge_unequal = merge.note(), merge.unequal()
        merged.assembled_dir = scratch if tensors else None  # its data_names are absolute paths in there
        for r in readers[1:]:
            r.data = {}
        sides = []
        for reader in ((merged, single) if isinstance(target, tuple) else (single, merged)):
            frame = frame_from_records(reader.data)
            reader.data = {}
            sides.append((reader, frame))
    return sides[0], sides[1]


class ShardMerge:
    """Merges the `data` of N rank dumps (rank order) into one `data`.

    Args:
        tensor_dirs: each rank's tensor folder (tensor mode), or None.
        out_dir: where assembled tensors are written (tensor mode), or None.
        hint: the golden dump's `data` (its shapes tell how plain tensors were split), or None.
    """

    def __init__(self, tensor_dirs=None, out_dir=None, hint=None):
        self.tensor_dirs = tensor_dirs
        self.out_dir = out_dir
        self.hint = hint or {}
        self.files = 0
        self.split = None           # rank -> rows of the batch, from the first tensor concatenated in forward
        self.split_at = None        # where it was seen
        self.data_parallel = False  # the ranks split the batch
        self.averaged = 0           # values merged as the ranks' weighted mean

    def note(self):
        """One line on what a data-parallel merge assumed, or None when the ranks did not split a batch."""
        if not self.data_parallel:
            return None
        if self.split:
            rows = ", ".join(str(n) for n in self.split.values())
            split = (f"the ranks hold {rows} of the batch's {sum(self.split.values())} rows (split seen at "
                     f"{self.split_at})")
        else:
            split = "the batch's split among the ranks was not seen: equal parts assumed"
        if self.split and len(set(self.split.values())) > 1:
            split += ("; the parts are unequal, and DDP and FSDP average the ranks' gradients with equal weights, "
                      "which is not the whole batch's gradient: from that averaging on, values differ by design")
        return (f"data-parallel merge: {split}; {self.averaged} per-rank value(s) shaped as golden's (losses, "
                f"local gradients) averaged by those parts and backward pieces scaled by them, as holds for a loss "
                f"that is the mean over the batch (another reduction needs its own golden)")

    def unequal(self):
        """The ranks split the batch into unequal parts: gradients averaged with equal weights then differ
        from the whole batch's."""
        return bool(self.data_parallel and self.split and len(set(self.split.values())) > 1)

    def _weights(self, ranks):
        """Each rank's share of the batch (equal shares when the split was not seen)."""
        if self.split and all(r in self.split for r in ranks):
            total = sum(self.split[r] for r in ranks)
            return [self.split[r] / total for r in ranks]
        return [1.0 / len(ranks)] * len(ranks)

    def merge(self, datas):
        keys = dict.fromkeys(k for d in datas for k in d)  # rank 0's order, then keys only others have
        return {k: self._value([d.get(k) for d in datas], self.hint.get(k), k) for k in keys}

    def _value(self, values, hint, stem):
        present = [(i, v) for i, v in enumerate(values) if v is not None]
        if not present:
            return None
        first = present[0][1]
        if isinstance(first, dict):
            if _is_tensor(first):
                return self._tensor(present, hint if isinstance(hint, dict) else None, stem)
            hint = hint if isinstance(hint, dict) else {}
            return {n: self._value([v.get(n) if isinstance(v, dict) else None for v in values], hint.get(n),
                                   f"{stem}.{n}")
                    for n in dict.fromkeys(n for _, v in present if isinstance(v, dict) for n in v)}
        if isinstance(first, list):
            hint = hint if isinstance(hint, list) else []
            return [self._value([v[i] if isinstance(v, list) and i < len(v) else None for v in values],
                                hint[i] if i < len(hint) else None, f"{stem}.{i}")
                    for i in range(len(first))]
        return first

    def _tensor(self, present, hint, stem):
        recs = [r for _, r in present if _is_tensor(r)]
        ranks = [i for i, r in present if _is_tensor(r)]
        if any("shard" in r for r in recs):
            pieces, partial = _dtensor_pieces(recs, ranks)
            shape = recs[0]["shape"]
        else:
            pieces, shape = _plain_pieces(recs, ranks, hint)
            partial = False
            backward = ".backward." in stem or ".parameters_grad." in stem
            if pieces is not None and self.split is None and not backward:
                dim = next(d for d, n in enumerate(shape) if n != recs[0]["shape"][d] or len(recs) == 1)
                self.split = {rank: r["shape"][dim] for rank, r in zip(ranks, recs)}
                self.split_at = stem
                self.data_parallel = self.data_parallel or dim == 0
            # a gradient that differs between tensor-parallel ranks is a partial sum, not a per-rank mean
            if (pieces is None and ((backward and self.data_parallel) or _numel(recs[0]["shape"]) == 1)
                    and _reduced_per_rank(recs, hint)):
                self.data_parallel = True
                return self._averaged(recs, ranks, stem)
            if pieces is not None and backward and self.data_parallel:
                weights = dict(zip(ranks, self._weights(ranks)))
                pieces = [(rank, offset, _scaled(rec, weights[rank])) for rank, offset, rec in pieces]
        if pieces is None:  # replicated, or split in a way the shapes do not tell
            return recs[0]
        out = {k: v for k, v in recs[0].items() if k not in ("shard", "data_name")}
        out["shape"] = list(shape)
        out.update(_merged_stats([p[2] for p in pieces]) if not partial else dict.fromkeys(_STATS))
        if "md5" in out:
            out["md5"] = None  # a checksum of the parts is not the checksum of the whole
        if self.tensor_dirs is not None and self.out_dir is not None:
            path = self._assemble(pieces, shape, partial, stem)
            if path is not None:
                out["data_name"] = path
        return out

    def _assemble(self, pieces, shape, partial, stem):
        """One .npy of the whole tensor from the pieces' files (absolute path), or None without them."""
        from msprobe.core.dump.tensor_files import load_tensor_file, save_npy
        from msprobe.core.errors import MsprobeError
        whole = None
        for rank, offset, rec in pieces:
            name = rec.get("data_name")
            if not name:
                return None
            try:
                part = np.asarray(load_tensor_file(os.path.join(self.tensor_dirs[rank], name)).array)
            except MsprobeError:
                return None
            if "_scale" in rec:
                part = part * np.asarray(rec["_scale"], dtype=part.dtype)
            if whole is None:
                whole = np.zeros(shape, dtype=part.dtype)
            region = tuple(slice(o, o + n) for o, n in zip(offset, part.shape))
            if partial:
                whole[region] += part
            else:
                whole[region] = part
        if whole is None:
            return None
        self.files += 1
        path = os.path.join(self.out_dir, f"{self.files}.{stem}.npy")
        save_npy(path, whole)
        return path


    def _averaged(self, recs, ranks, stem):
        """The ranks' weighted mean of a value each reduced over its part of the batch."""
        self.averaged += 1
        weights = self._weights(ranks)
        out = {k: v for k, v in recs[0].items() if k not in ("shard", "data_name")}
        means = [_float(r.get("Mean")) for r in recs]
        mean = None if any(m is None for m in means) else sum(w * m for w, m in zip(weights, means))
        out.update(dict.fromkeys(_STATS))
        if mean is not None:
            out["Mean"] = _json_number(mean)
            if _numel(recs[0]["shape"]) == 1:
                out.update(Max=out["Mean"], Min=out["Mean"], Norm=_json_number(abs(mean)))
        if "md5" in out:
            out["md5"] = None
        if self.tensor_dirs is not None and self.out_dir is not None:
            pieces = [(rank, (0,) * len(r["shape"]), dict(r, _scale=w)) for rank, r, w in zip(ranks, recs, weights)]
            path = self._assemble(pieces, recs[0]["shape"], True, stem)
            if path is not None:
                out["data_name"] = path
        return out


def _reduced_per_rank(recs, hint):
    """Float tensors shaped as golden's on every rank whose values differ between ranks: each rank reduced
    them over its own part of the batch (a mean loss, a weight gradient before it is averaged). Asked of
    one-element values and gradients only: a weight that differs between ranks is no reduction."""
    if len(recs) < 2 or not (hint and _is_tensor(hint)) or "float" not in str(recs[0].get("dtype", "")).lower():
        return False
    shape = recs[0]["shape"]
    if hint["shape"] != shape or any(r["shape"] != shape for r in recs):
        return False
    return any(r.get(s) != recs[0].get(s) for r in recs[1:] for s in _STATS)


def _scaled(rec, factor):
    """A record with its statistics multiplied by a positive factor (its tensor file too, when assembled)."""
    out = dict(rec, _scale=factor * rec.get("_scale", 1.0))
    for s in _STATS:
        v = _float(rec.get(s))
        if v is not None and not isinstance(rec.get(s), bool):
            out[s] = _json_number(v * factor) if math.isfinite(v) else rec.get(s)
    return out


def _is_tensor(v):
    return isinstance(v, dict) and "dtype" in v and isinstance(v.get("shape"), list)


def _numel(shape):
    return math.prod(shape) if shape else 1


def _dtensor_pieces(recs, ranks):
    """([(rank, offset, record)] of the distinct shards, partial?) from DTensor records."""
    pieces, seen, partial = [], set(), False
    for rank, r in zip(ranks, recs):
        shard = r.get("shard") or {}
        offset = tuple(shard.get("offset") or [0] * len(r["shape"]))
        local = shard.get("local_shape") or r["shape"]
        placements = shard.get("placements") or []
        is_partial = any(p.startswith("Partial") for p in placements)
        partial = partial or is_partial
        # replicas of a shard share its offset; pieces of a Partial value are summed, every one counts
        coord = tuple(shard.get("coordinate") or ()) if is_partial else ()
        if (offset, coord) in seen or _numel(local) == 0:
            continue
        seen.add((offset, coord))
        pieces.append((rank, offset, dict(r, shape=list(local))))
    return pieces, partial


def _plain_pieces(recs, ranks, hint):
    """([(rank, offset, record)], whole shape) of plain local tensors concatenated along one dimension,
    or (None, None) when they are replicas or the shapes do not say how they were split."""
    shapes = [r["shape"] for r in recs]
    if len(recs) < 2 or any(len(s) != len(shapes[0]) for s in shapes) or not shapes[0]:
        return None, None
    golden = hint.get("shape") if hint and _is_tensor(hint) else None
    differ = [d for d in range(len(shapes[0])) if len({s[d] for s in shapes}) > 1]
    if len(differ) == 1:
        dim = differ[0]
    elif differ or golden is None or golden == shapes[0] or len(golden) != len(shapes[0]):
        return None, None
    else:
        fits = [d for d in range(len(golden)) if golden[d] == sum(s[d] for s in shapes)
                and all(golden[e] == shapes[0][e] for e in range(len(golden)) if e != d)]
        if not fits:
            return None, None
        dim = fits[0]
    others = [d for d in range(len(shapes[0])) if d != dim]
    if any(s[d] != shapes[0][d] for s in shapes for d in others):
        return None, None
    pieces, at = [], 0
    for rank, r in zip(ranks, recs):
        offset = [0] * len(r["shape"])
        offset[dim] = at
        at += r["shape"][dim]
        if _numel(r["shape"]):
            pieces.append((rank, tuple(offset), r))
    whole = list(shapes[0])
    whole[dim] = at
    return pieces, whole


def _float(v):
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return None
    return None


def _json_number(x):
    if math.isfinite(x):
        return x
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


def _merged_stats(recs):
    """Whole-tensor Max/Min/Mean/Norm of disjoint pieces: max of maxes, min of mins, mean weighted by
    element count, root of the summed squared norms (None where a piece lacks the value)."""
    out = {}
    counts = [_numel(r["shape"]) for r in recs]
    if isinstance(recs[0].get("Max"), bool):  # bool tensors: Max = any, Min = all
        return {"Max": any(r.get("Max") for r in recs), "Min": all(r.get("Min") for r in recs),
                "Mean": None, "Norm": None}
    cols = {s: [_float(r.get(s)) for r in recs] for s in _STATS}
    for s in _STATS:
        vals = cols[s]
        if any(v is None for v in vals):
            out[s] = None
        elif any(math.isnan(v) for v in vals):
            out[s] = "nan"
        elif s == "Max":
            out[s] = _json_number(max(vals))
        elif s == "Min":
            out[s] = _json_number(min(vals))
        elif s == "Mean":
            out[s] = _json_number(sum(v * n for v, n in zip(vals, counts)) / sum(counts))
        else:
            out[s] = _json_number(math.sqrt(sum(v * v for v in vals)))
    return out
