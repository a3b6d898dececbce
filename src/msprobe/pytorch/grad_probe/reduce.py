"""Reduce a list of gradients to what one grad_probe step records.

On the CPU: numpy on views of the gradients (single-threaded passes, no copies), the sign bits packed
at once through one reused bool buffer, so no gradient-sized allocation per step. On an accelerator:
Max, Min, Norm (then the L2 interval shares) stacked into one float32 tensor, the bits packed on the
device, and both copied to the host as one uint8 buffer (pinned, non-blocking on CUDA) that the writer
thread waits for; the training loop never synchronises. Guarded by benchmarks/grad_probe_overhead.py.
"""


import numpy as np
import torch

from msprobe.core.checksum import crc32_hex
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


def _host_view(g):
    """A flat numpy view of a CPU gradient; 16-bit floats as a float32 copy (numpy has no bfloat16, and
    a float16 norm would overflow)."""
    if g.dtype in (torch.bfloat16, torch.float16):
        g = g.float()
    return g.numpy().reshape(-1)


class GradReducer:
    """Turns the gradients of one step into a `resolve()` for the writer.

    Args:
        level: L0, L1 or L2.
        bounds: interval boundaries for L2.
        numpy_on_cpu: take the numpy path for CPU gradients (default); False runs the accelerator path
            on the CPU, which is how the tests check it on machines without one.
    """

    def __init__(self, level, bounds, numpy_on_cpu=True):
        self.level = level
        self.numpy_on_cpu = numpy_on_cpu
        self.bounds = bounds
        self._np_bounds = np.asarray(bounds, dtype=np.float64)
        self._consts = {}  # device -> (boundaries float32, bit weights uint8)
        self._bool_buf = np.empty(0, dtype=bool)  # reused for the comparisons on the CPU

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
        nonempty = [g for g in grads if g.numel()]
        numels = [g.numel() for g in grads]
        md5 = [g.to("cpu", copy=True) for g in grads] if self.level == "L0" else None
        if device.type == "cpu" and self.numpy_on_cpu:
            # numpy on views of the gradients: single-threaded passes, no allocation, no thread pool to
            # wake for every parameter (torch's CPU reductions fork-join per call)
            views = [_host_view(g) for g in nonempty]
            stats = np.array([[v.max() for v in views], [v.min() for v in views],
                              [np.linalg.norm(v) for v in views]], dtype=np.float32).reshape(-1)
            dist = np.stack([self._host_shares(v) for v in views]) if self.level == "L2" and views else None
            packed = [self._host_bits(_host_view(g)) for g in grads] if self.level != "L0" else None
            return lambda: self._resolve(numels, stats, dist, packed, md5)
        parts = []
        if nonempty:
            minmax = [torch.aminmax(g) for g in nonempty]
            parts = [torch.stack([m.max for m in minmax]).float(), torch.stack([m.min for m in minmax]).float(),
                     torch.stack(torch._foreach_norm(nonempty, 2, dtype=torch.float32))]
        bounds, weights = self._constants(device)
        if self.level == "L2" and nonempty:
            parts.append(self._device_shares(nonempty, bounds).reshape(-1))
        stats = torch.cat(parts) if parts else torch.empty(0, device=device)
        bits = [_pack_on_device(g.reshape(-1) > 0, weights) for g in grads] if self.level != "L0" else []
        host, done = _to_host(torch.cat([stats.view(torch.uint8)] + bits))
        sizes = [stats.numel() * 4] + [b.numel() for b in bits]
        m, k = len(nonempty), len(self.bounds) + 2

        def resolve():
            if done is not None:
                done.synchronize()
            raw = host.numpy()
            ends = np.cumsum(sizes)
            chunks = [raw[a:b] for a, b in zip(np.concatenate(([0], ends[:-1])), ends)]
            values = chunks[0].view(np.float32)
            dist = values[3 * m:].reshape(m, k) if self.level == "L2" and m else None
            return self._resolve(numels, values[:3 * m], dist, chunks[1:] if bits else None, md5)
        return resolve

    def _host_bits(self, flat):
        return np.packbits(np.greater(flat, 0, out=self._buffer(flat.size)))

    def _host_shares(self, flat):
        # counts of x <= b for each bound through the reused buffer (faster than searchsorted for a
        # few bounds), differenced into the right-closed intervals of the columns
        buf = self._buffer(flat.size)
        at_most = [np.count_nonzero(np.less_equal(flat, b, out=buf)) for b in self._np_bounds]
        counts = np.diff([0, *at_most, flat.size])
        zeros = flat.size - np.count_nonzero(flat)
        return np.append(counts, zeros).astype(np.float32) / np.float32(flat.size)

    def _buffer(self, n):
        if self._bool_buf.size < n:
            self._bool_buf = np.empty(n, dtype=bool)
        return self._bool_buf[:n]

    def _device_shares(self, grads, bounds):
        k = len(self.bounds) + 1
        counts = torch.stack([torch.cat((torch.bincount(torch.bucketize(g.reshape(-1).float(), bounds), minlength=k),
                                         (g == 0).sum().reshape(1))) for g in grads])
        sizes = torch.tensor([g.numel() for g in grads], dtype=torch.float32, device=grads[0].device)
        return counts.float() / sizes[:, None]

    def _resolve(self, numels, stats, dist, packed, md5_copies):
        m = sum(1 for x in numels if x)
        nan = np.float32("nan")
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
                    dists.append([nan] * (len(self.bounds) + 2))
        md5 = None
        if md5_copies is not None:
            md5 = [crc32_hex(c.reshape(-1).view(torch.uint8).numpy()) for c in md5_copies]
        return StepResult(stats=rows, md5=md5, dist=dists, bits=packed)
