"""Reduce a list of gradients to what one grad_probe step records, on their own device.

Statistics of all parameters are stacked into one float32 tensor (Max, Min, Norm, then the L2 interval
shares). On an accelerator the sign bitmaps are packed there too, and statistics and bitmaps travel to
the host as one uint8 buffer (pinned, non-blocking on CUDA) that the writer thread waits for; the
training loop never synchronises. Guarded by benchmarks/grad_probe_overhead.py.
"""

import zlib

import numpy as np
import torch

from msprobe.core.grad_probe.writer import StepResult

_BIT_ORDER = (128, 64, 32, 16, 8, 4, 2, 1)  # np.packbits' order: first element in the high bit


def _pack_on_device(positive, weights):
    """np.packbits of a flat bool tensor, computed where the tensor lives."""
    pad = (-positive.numel()) % 8
    if pad:
        positive = torch.cat((positive, positive.new_zeros(pad)))
    return (positive.view(-1, 8).to(torch.uint8) * weights).sum(1, dtype=torch.uint8)


def _to_host(buf):
    """(host tensor, event or None): start copying `buf` to the host without blocking on CUDA."""
    if buf.device.type == "cuda":
        host = torch.empty(buf.shape, dtype=buf.dtype, pin_memory=True)
        host.copy_(buf, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return host, done
    return buf.to("cpu"), None


class GradReducer:
    """Turns the gradients of one step into a `resolve()` for the writer.

    Args:
        level: L0, L1 or L2.
        bounds: interval boundaries for L2.
    """

    def __init__(self, level, bounds):
        self.level = level
        self.bounds = bounds
        self._consts = {}  # device -> (boundaries float32, bit weights uint8)

    def _constants(self, device):
        c = self._consts.get(device)
        if c is None:
            c = self._consts[device] = (torch.tensor(self.bounds, dtype=torch.float32, device=device),
                                        torch.tensor(_BIT_ORDER, dtype=torch.uint8, device=device))
        return c

    @torch.no_grad()
    def reduce(self, grads):
        """grads: detached dense tensors on one device. Returns a () -> StepResult callable."""
        device = grads[0].device
        bounds, weights = self._constants(device)
        nonempty = [g for g in grads if g.numel()]
        parts = []
        if nonempty:
            minmax = [torch.aminmax(g) for g in nonempty]
            parts = [torch.stack([m.max for m in minmax]).float(), torch.stack([m.min for m in minmax]).float(),
                     torch.stack(torch._foreach_norm(nonempty, 2, dtype=torch.float32))]
            if self.level == "L2":
                k = len(self.bounds) + 1
                counts = torch.stack([torch.cat((
                    torch.bincount(torch.bucketize(g.reshape(-1).float(), bounds), minlength=k),
                    (g == 0).sum().reshape(1))) for g in nonempty])
                sizes = torch.tensor([g.numel() for g in nonempty], dtype=torch.float32, device=device)
                parts.append((counts.float() / sizes[:, None]).reshape(-1))
        stats = torch.cat(parts) if parts else torch.empty(0, device=device)
        bits = [g.reshape(-1) > 0 for g in grads] if self.level in ("L1", "L2") else None
        md5 = [g.to("cpu", copy=True) for g in grads] if self.level == "L0" else None
        numels = [g.numel() for g in grads]
        if device.type == "cpu":
            return lambda: self._resolve(numels, stats.numpy(), _packbits_host(bits), md5)
        packed = [_pack_on_device(b, weights) for b in bits] if bits is not None else []
        host, done = _to_host(torch.cat([stats.view(torch.uint8)] + packed))
        n_bytes = [stats.numel() * 4] + [p.numel() for p in packed]

        def resolve():
            if done is not None:
                done.synchronize()
            raw = host.numpy()
            ends = np.cumsum(n_bytes)
            chunks = [raw[a:b] for a, b in zip(np.concatenate(([0], ends[:-1])), ends)]
            return self._resolve(numels, chunks[0].view(np.float32), (lambda: chunks[1:]) if bits else None, md5)
        return resolve

    def _resolve(self, numels, stats, packed, md5_copies):
        m = sum(1 for x in numels if x)
        dist_len = len(self.bounds) + 2
        dist = stats[3 * m:].reshape(m, dist_len) if self.level == "L2" and m else None
        nan = float("nan")
        rows, dists, j = [], ([] if self.level == "L2" else None), 0
        for numel in numels:
            if numel:
                rows.append((stats[j], stats[m + j], stats[2 * m + j]))
                if dists is not None:
                    dists.append(list(dist[j]))
                j += 1
            else:
                rows.append((nan, nan, nan))
                if dists is not None:
                    dists.append([nan] * dist_len)
        md5 = None
        if md5_copies is not None:
            md5 = [f"{zlib.crc32(c.reshape(-1).view(torch.uint8).numpy()) & 0xFFFFFFFF:08x}" for c in md5_copies]
        return StepResult(stats=rows, md5=md5, dist=dists, bits=packed() if packed is not None else None)


def _packbits_host(bits):
    if bits is None:
        return None
    return lambda: [np.packbits(b.numpy()) for b in bits]
