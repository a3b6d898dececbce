"""Argument and output records laid out as msProbe does, shared by both adapters' DumpSession.

A session supplies `value_record(v, file_stem, save, waits)` (tensors, scalars, framework types);
`CallRecords` turns a call's arguments and result into `input_args` (a list), `input_kwargs` (a dict)
and `output` (a list), with tensor file stems `{key}.{role}.{i}` / `{key}.{role}.{name}` — built only
when the call saves tensor files (`file_stem` is None otherwise: nothing is built for a tensor that is
only summarised). The records
of the non-tensor values both frameworks pass alike (slices, Ellipsis, other objects) are here too.
A tensor's record on the hot path may be a `TensorRecord`: a small tuple, shared by every record of
the same unchanged tensor, that becomes msProbe's dict only when the batch is written (`as_dict`, called
by the JSON encoder: json_append.py). Framework-free.
"""


class TensorRecord(tuple):
    """(type, dtype name, shape, values, requires_grad) of a tensor whose summary is complete; `values`
    holds its value fields (Max, Min, Mean, Norm, md5) in msProbe's order. Immutable: never extended
    (a record that gets `data_name` or a shard is a dict from the start)."""

    __slots__ = ()

    def as_dict(self):
        rec = {"type": self[0], "dtype": self[1], "shape": list(self[2])}
        rec.update(self[3])
        rec["requires_grad"] = self[4]
        return rec


def record_default(value):
    """orjson's `default`: a TensorRecord is written as its dict."""
    if type(value) is TensorRecord:  # (as_dict's body: one frame per tensor at write time, not two)
        rec = {"type": value[0], "dtype": value[1], "shape": list(value[2])}
        rec.update(value[3])
        rec["requires_grad"] = value[4]
        return rec
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


class CallRecords:
    """Mixin of a DumpSession that has `value_record`."""

    # tuple subclasses recorded as one value (torch.Size), not element by element
    atomic_sequences = ()

    def args_records(self, key, args, kwargs, role, save, waits, buffers=()):
        """`buffers`: positions and names of arguments the call only writes into (a collective's output
        tensors): their memory before the call is not data, so their records are `buffer_record`s."""
        if not save:
            if buffers:
                return ([self.buffer_record(x) if i in buffers else self.value_record(x, None, False, waits)
                         for i, x in enumerate(args)],
                        {n: self.buffer_record(x) if n in buffers else self.value_record(x, None, False, waits)
                         for n, x in kwargs.items()})
            # (no keyword arguments, the common case: without a comprehension's frame)
            return ([self.value_record(x, None, False, waits) for x in args],
                    {n: self.value_record(x, None, False, waits) for n, x in kwargs.items()} if kwargs else {})
        stem = f"{key}.{role}"
        if buffers:
            a = [self.buffer_record(x) if i in buffers else self.value_record(x, f"{stem}.{i}", save, waits)
                 for i, x in enumerate(args)]
            k = {n: self.buffer_record(x) if n in buffers else self.value_record(x, f"{stem}.{n}", save, waits)
                 for n, x in kwargs.items()}
            return a, k
        a = [self.value_record(x, f"{stem}.{i}", save, waits) for i, x in enumerate(args)]
        k = {n: self.value_record(x, f"{stem}.{n}", save, waits) for n, x in kwargs.items()}
        return a, k

    def outputs_record(self, key, out, save, waits):
        if isinstance(out, (list, tuple)) and not isinstance(out, self.atomic_sequences):
            if not save:
                return [self.value_record(x, None, False, waits) for x in out]
            return [self.value_record(x, f"{key}.output.{i}", save, waits) for i, x in enumerate(out)]
        return [self.value_record(out, f"{key}.output.0" if save else None, save, waits)]


def common_value_record(v):
    """Record of a slice, Ellipsis or any other object as msProbe writes them (an object: its type only)."""
    if isinstance(v, slice):
        return {"type": "slice", "value": [x if isinstance(x, (int, type(None))) else str(x)
                                           for x in (v.start, v.stop, v.step)]}
    if v is Ellipsis:
        return {"type": "ellipsis", "value": "..."}
    cls = type(v)
    return {"type": f"{cls.__module__}.{cls.__qualname__}", "value": None}
