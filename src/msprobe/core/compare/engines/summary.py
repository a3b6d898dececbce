"""A pair's suspects kept small, whatever the engine: what a task sends back and the driver holds.

A pair of a many-rank compare has hundreds of suspects; past the few that keep their evidence
(`trim_evidence`), each still carries what ranks it over all pairs (its call's key and order, kind,
tier, errors, reason). As dataclasses with a `Call` each that is about 1 KB a suspect, half a
gigabyte at 1024 pairs. Here a trimmed suspect is a slotted `SlimSuspect`, and the driver's
`Interner` shares what pairs repeat (the same call on every rank, the same reason), so a thousand
pairs' suspects cost tens of MB. `diagnosis.combine` reads them as it reads `flow.CallSuspect`.
Must not import torch or mindspore.
"""
from __future__ import annotations

from types import MappingProxyType

_NO_ORIGINS = MappingProxyType({})  # a trimmed suspect's origins: read only, shared


class SlimSuspect:
    """A `flow.CallSuspect` whose evidence was let go: the same attributes, in slots."""

    __slots__ = ("call", "kind", "tier", "input_error", "output_error", "amplification", "reason", "origins",
                 "folded_modules", "trimmed", "idle")

    def __init__(self, call, kind, tier, input_error, output_error, amplification, reason, origins=_NO_ORIGINS,
                 folded_modules=(), trimmed=True, idle=False):
        self.call, self.kind, self.tier = call, kind, tier
        self.input_error, self.output_error, self.amplification = input_error, output_error, amplification
        self.reason, self.origins, self.trimmed, self.idle = reason, origins or _NO_ORIGINS, trimmed, idle
        self.folded_modules = tuple(folded_modules)

    def __reduce__(self):  # the shared empty origins is no picklable thing: it goes as {}
        return SlimSuspect, tuple({} if n == "origins" else getattr(self, n) for n in self.__slots__)


def slim_suspects(suspects):
    """`suspects` with each trimmed one as a SlimSuspect (a field `flow.CallSuspect` gained and this lacks
    is a TypeError here, not a suspect silently changed)."""
    return [SlimSuspect(**vars(s)) if getattr(s, "trimmed", False) and not isinstance(s, SlimSuspect) else s
            for s in suspects]


class Interner:
    """One object for each value pairs repeat: trimmed calls (key, order, direction), kinds, reasons,
    errors. Only the driver's copy of a trimmed suspect is shared; restoring one rebinds its call."""

    def __init__(self):
        self._seen = {}

    def _one(self, value):
        # a float by its bits: -0.0 is not 0.0 and a nan is one nan
        key = (float, value.hex()) if type(value) is float else (type(value), value)
        return self._seen.setdefault(key, value)

    def suspects(self, suspects):
        out = []
        for s in slim_suspects(suspects):
            if isinstance(s, SlimSuspect):
                c = s.call
                s.call = self._seen.setdefault(("call", c.key, c.order, c.direction, c.is_module), c)
                s.kind, s.reason = self._one(s.kind), self._one(s.reason)
                s.input_error, s.output_error = self._one(s.input_error), self._one(s.output_error)
                s.amplification = self._one(s.amplification)
            out.append(s)
        return out
