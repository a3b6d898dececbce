"""Reduce the gradients of one optimizer call to what grad_probe records, with MindSpore ops.

Statistics of all parameters are stacked into one float32 tensor and the sign bits of all parameters
concatenated into one bool tensor, so a step costs two device-to-host copies whatever the parameter
count; packing the bits and the checksums run on the writer thread.
"""


import mindspore as ms
import numpy as np
from mindspore import ops

from msprobe.core.checksum import crc32_hex
from msprobe.core.grad_probe.writer import StepResult


def _host_bytes(g):
    """The gradient's bytes for the L0 checksum (bfloat16 has no numpy type: its float32 upcast)."""
    if g.dtype == ms.bfloat16:
        g = g.astype(ms.float32)
    return np.ascontiguousarray(g.asnumpy())


class GradReducer:
    """Turns the gradients of one step into a `resolve()` for the writer.

    Args:
        level: L0, L1 or L2.
        bounds: interval boundaries for L2.
    """

    def __init__(self, level, bounds):
        self.level = level
        self.bounds = [float(b) for b in bounds]

    def reduce(self, grads):
        """grads: MindSpore tensors. Returns a () -> StepResult callable."""
        numels = [int(g.size) for g in grads]
        rows = []
        for g, n in zip(grads, numels):
            if not n:
                continue
            x = g.astype(ms.float32).reshape(-1)
            cols = [x.max(), x.min(), ops.sqrt((x * x).sum())]
            if self.level == "L2":  # counts of x <= b for each bound, then of zeros; shares on the host
                cols += [(x <= b).astype(ms.float32).sum() for b in self.bounds]
                cols.append((x == 0).astype(ms.float32).sum())
            rows.append(ops.stack(cols))
        stats = ops.stack(rows).asnumpy() if rows else np.zeros((0, 3), np.float32)
        bits = None
        if self.level in ("L1", "L2"):
            flat = [(g > 0).reshape(-1) for g, n in zip(grads, numels) if n]
            bits = ops.cat(flat).asnumpy() if flat else np.zeros(0, bool)
        md5 = [_host_bytes(g) for g in grads] if self.level == "L0" else None
        return lambda: self._resolve(numels, stats, bits, md5)

    def _resolve(self, numels, stats, bits, md5_copies):
        nan = np.float32("nan")
        dist_len = len(self.bounds) + 2
        out_stats, dists, packed = [], ([] if self.level == "L2" else None), ([] if bits is not None else None)
        j, offset = 0, 0
        for n in numels:
            if n:
                row = stats[j]
                out_stats.append((row[0], row[1], row[2]))
                if dists is not None:
                    at_most = np.concatenate(([0.0], row[3:3 + len(self.bounds)], [n])).astype(np.float64)
                    dists.append([np.float32(v) for v in np.diff(at_most) / n] + [np.float32(row[-1] / n)])
                if packed is not None:
                    packed.append(np.packbits(bits[offset:offset + n]))
                j, offset = j + 1, offset + n
            else:
                out_stats.append((nan, nan, nan))
                if dists is not None:
                    dists.append([nan] * dist_len)
                if packed is not None:
                    packed.append(np.zeros(0, np.uint8))
        md5 = None
        if md5_copies is not None:
            md5 = [crc32_hex(a.reshape(-1).view(np.uint8)) for a in md5_copies]
        return StepResult(stats=out_stats, md5=md5, dist=dists, bits=packed)
