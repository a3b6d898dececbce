"""Memory-keyed reuse of summaries: values seen again unchanged — the same memory at the same version
counter, while that memory is alive (a weak reference to its storage) — reuse their statistics: an API's
input is usually the previous API's output, an optimizer's gradient is the one backward produced. A
tensor is keyed by the elements it covers, not its shape: `view`, `reshape`, `transpose`, `flatten`
outputs (and their gradients) hold the same elements as their input, so the same statistics; the
checksum of a permuted view reads other bytes first, so with md5 a non-contiguous view is keyed exactly."""

from msprobe.pytorch.summary.layout import element_span

# entries kept before the table starts over
CACHE_LIMIT = 4096
# a dense host tensor of fewer elements is read again at each record, not keyed (unless its entry is asked
# for: a saved file to link): its kernel costs less than its key, weak reference, entry and table row
UNKEYED_MAX = 8192


class CacheEntry:
    """What is known about one stretch of memory at one version: its statistics (and checksum) —
    `values`, plus `slots` still on their way from the device — and, once written, the .npy file of
    the tensor `layout` (shape, strides) that was saved from it."""

    __slots__ = ("ref", "version", "values", "slots", "file", "layout")

    def __init__(self, ref, version, values, slots):
        self.ref, self.version, self.values, self.slots = ref, version, values, slots
        self.file = self.layout = None

    def file_for(self, t):
        """The saved file when it holds exactly `t` (same shape and strides), else None."""
        if self.file is not None and self.layout == (t.shape, t.stride()):
            return self.file
        return None

    def set_file(self, t, path):
        self.file, self.layout = path, (t.shape, t.stride())


def exact_key(t):
    """Key of `t` as laid out: its start, shape and strides."""
    return (t.data_ptr(), t.dtype, t.shape, t.stride(), t.device)


def memory_key(t, n, exact):
    """(cache key, element span or None) of `t`: the key is the elements `t` covers — where it starts
    and its strides with sizes in memory order, adjacent dimensions merged — so every view of the same
    elements shares it; `exact` (md5: the checksum reads elements in index order): only contiguous
    views share."""
    if n > 1 and t.is_contiguous():
        span = ((1, n),)
    elif n <= 1 or exact:
        return exact_key(t), None
    else:
        span = element_span(t)
    return (t.data_ptr(), t.dtype, t.device, span), span
