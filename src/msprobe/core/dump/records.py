"""Argument and output records laid out as msProbe does, shared by both adapters' DumpSession.

A session supplies `value_record(v, file_stem, save, waits)` (tensors, scalars, framework types);
`CallRecords` turns a call's arguments and result into `input_args` (a list), `input_kwargs` (a dict)
and `output` (a list), with tensor file stems `{key}.{role}.{i}` / `{key}.{role}.{name}` — built only
when the call saves tensor files (`file_stem` is None otherwise: nothing is built for a tensor that is
only summarised); a value of the session's `quick_types` (plain tensors) goes straight to its
`quick_record(v)` when nothing is saved. The records of the non-tensor values both frameworks pass
alike (slices, Ellipsis, other objects) are here too. Framework-free.
"""


class CallRecords:
    """Mixin of a DumpSession that has `value_record`."""

    # tuple subclasses recorded as one value (torch.Size), not element by element
    atomic_sequences = ()
    # types whose record, when no file is saved, is `quick_record(v)` (set by the adapter): one frame
    # a tensor, not value_record's and the summarizer's
    quick_types = ()

    def quick_record(self, v):
        return self.value_record(v, None, False, ())

    def args_records(self, key, args, kwargs, role, save, waits, buffers=()):
        """`buffers`: positions and names of arguments the call only writes into (a collective's output
        tensors): their memory before the call is not data, so their records are `buffer_record`s."""
        if not save:
            if buffers:
                return ([self.buffer_record(x) if i in buffers else self.value_record(x, None, False, waits)
                         for i, x in enumerate(args)],
                        {n: self.buffer_record(x) if n in buffers else self.value_record(x, None, False, waits)
                         for n, x in kwargs.items()})
            quick, types, value = self.quick_record, self.quick_types, self.value_record
            # (no keyword arguments, the common case: without a comprehension's frame)
            return ([quick(x) if type(x) in types else value(x, None, False, waits) for x in args],
                    {n: quick(x) if type(x) in types else value(x, None, False, waits)
                     for n, x in kwargs.items()} if kwargs else {})
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
        if not save and type(out) in self.quick_types:  # one tensor, the common case
            return [self.quick_record(out)]
        if isinstance(out, (list, tuple)) and not isinstance(out, self.atomic_sequences):
            if not save:
                quick, types, value = self.quick_record, self.quick_types, self.value_record
                return [quick(x) if type(x) in types else value(x, None, False, waits) for x in out]
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
