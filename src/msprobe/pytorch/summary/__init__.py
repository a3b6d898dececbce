"""Tensor summaries of the PyTorch dump: statistics (Max/Min/Mean/Norm) and the CRC-32 checksum.

    summarizer.py     Summarizer: the entry point; a record per tensor, from the cache or computed
    cache.py          memory-keyed reuse: a key for the elements a tensor covers, the entry kept for it
    layout.py         where a tensor's elements lie in memory (spans, memory order)
    host.py           CPU tensors: the C kernel or torch's reductions, ISA-L's CRC-32, at once
    device.py         DeviceSummaries: tensors elsewhere into slots, deferred and launched in batches
    slots.py          the slots and buffers summaries land in on the device
    readback.py       a batch's slots to the host in one copy, rows to record fields
    torch_kernels.py  the kernels in torch ops (NPU, CUDA without Triton, the forced CPU path)
    triton_kernels.py the kernels in Triton (CUDA); the same protocol as torch_kernels
    transfer.py       copies between host and device

Kernel protocol (torch_kernels, triton_kernels): `statistics(batch)` with items (x, n, slot, rows) and
`checksum(batch)` with items (raw, slot): each writes every item's row of its slot; `handles(dtype)`.
Modules import only downwards in this list's dependency order (tests/pytorch/test_summary_imports.py).
"""
