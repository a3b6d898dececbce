"""Where a tensor's elements lie in memory: the spans that key the cache and the order reductions read in."""


def element_span(t):
    """((stride, size), ...) of `t` in memory order with size-1 dimensions dropped and a dimension
    merged into the one outside it when it steps over it exactly: equal for all views of the same
    elements (`x.chunk(3)[0].view(b, s, h, d).transpose(1, 2)` and the chunk itself)."""
    merged = []
    for stride, size in sorted(((st, sz) for st, sz in zip(t.stride(), t.shape) if sz != 1), reverse=True):
        if merged and merged[-1][0] == stride * size:
            merged[-1] = (stride, merged[-1][1] * size)
        else:
            merged.append((stride, size))
    return tuple(merged)


def memory_order(x):
    """`x` with its dimensions permuted into memory order when that makes it contiguous (a transposed
    view): reductions then stream through memory. Other tensors are returned as they are."""
    if x.is_contiguous() or x.dim() < 2:
        return x
    order = sorted(range(x.dim()), key=lambda d: (-x.stride(d), -x.shape[d]))
    y = x.permute(order)
    return y if y.is_contiguous() else x
