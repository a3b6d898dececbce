"""Find where inf/nan first appeared in a dump, across steps and ranks.

Per rank, a node is an origin when its inputs are finite and its outputs are not. A collective with
finite inputs and non-finite outputs is not an origin when a peer rank fed it a non-finite tensor (same
collective key with non-finite inputs there, or a send with non-finite inputs for a receive): the cause
then lies on that peer. Among the origins of the first step that has any, the one with the fewest
collectives before it comes first (collectives are the only clock ranks share), then dump order, then rank.
Origins on a rank after it received a peer's inf/nan are not counted: they are echoes of it (a tensor
saved for backward and overwritten in place by the collective, for instance).
"""

import logging
import os
from collections import defaultdict
from dataclasses import dataclass, field
from typing import List, Optional

from msprobe.core.dump.reader import RankDir, find_rank_dirs
from msprobe.core.dump.writer import rank_dir_name
from msprobe.core.errors import DumpFormatError, where
from msprobe.core.naming import is_module_key
from msprobe.core.overflow.scan import scan_rank

logger = logging.getLogger(__name__)

ORIGIN = "origin"                  # finite inputs, non-finite outputs
RECEIVED = "received"              # a collective whose non-finite output came from a peer rank
INHERITED = "inherited"            # no origin anywhere: the first node seen with non-finite values


@dataclass
class Anomaly:
    """One anomalous node.

    Attributes:
        kind: ``origin``, ``received`` (collective fed by `from_ranks`) or ``inherited``.
        label: ``rank_N`` or ``proc{pid}`` (the directory it was read from).
        stack: call-stack lines of the node (of its forward call for a backward node), may be empty.
        construct: the node and its enclosing modules, innermost first.
    """

    kind: str
    step: int
    rank: int
    label: str
    rank_dir: str
    key: str
    index: int
    comm_before: int
    record: dict
    stack: List[str] = field(default_factory=list)
    construct: List[str] = field(default_factory=list)
    from_ranks: List[int] = field(default_factory=list)

    def to_json(self):
        data = self.record if isinstance(self.record, dict) else {"output": [self.record]}
        out = {"op_name": self.key, "data_info": data, "construct_info": self.construct,
               "stack_info": self.stack, "kind": self.kind, "step": self.step, "rank": self.rank,
               "dump_dir": self.rank_dir}
        if self.from_ranks:
            out["from_ranks"] = self.from_ranks
        return out


@dataclass
class OverflowAnalysis:
    """Result of `analyze_overflow`.

    Attributes:
        anomalies: the culprit first, then every other rank's first origin in that step, then the
            collectives that only passed a peer's inf/nan on.
        scanned: how many rank directories were read.
        skipped: one line per rank directory that could not be read (the others were checked).
    """

    anomalies: List[Anomaly]
    scanned: int
    skipped: List[str] = field(default_factory=list)

    @property
    def culprit(self) -> Optional[Anomaly]:
        return self.anomalies[0] if self.anomalies else None

    def __bool__(self):
        """True when the dump is clean (no anomaly), like other verdict objects."""
        return not self.anomalies

    def by_label(self):
        """msProbe's layout: {"rank_N": [node, ...]}, the culprit's rank first."""
        out = {}
        for a in self.anomalies:
            out.setdefault(a.label, []).append(a.to_json())
        return out


def _label(rd):
    """msProbe's `rank_N` key for a rank; a process dir keeps its dump-format name, `proc{pid}`."""
    return rank_dir_name(None, rd.rank) if rd.is_proc else f"rank_{rd.rank}"


def _anomaly(kind, rd, reader, node, from_ranks=()):
    stack = reader.stack.get(node.key) or reader.stack.get(node.key.replace(".backward", ".forward")) or []
    chain, seen, cur = [node.key], {node.key}, reader.construct.get(node.key)
    while isinstance(cur, str) and cur not in seen:
        chain.append(cur)
        seen.add(cur)
        cur = reader.construct.get(cur)
    return Anomaly(kind, rd.step, rd.rank, _label(rd), rd.path, node.key, node.index, node.comm_before,
                   reader.data[node.key], list(stack), chain, sorted(from_ranks))


def _feeding_ranks(node, rank, nonfinite_comm_inputs):
    """Peer ranks whose collective input explains this collective's non-finite output."""
    ranks = set()
    for peer, feeds in nonfinite_comm_inputs.items():
        if peer == rank:
            continue
        if node.key in feeds["keys"] or (node.is_receiver and feeds["senders"]):
            ranks.add(peer)
    return ranks


def _innermost(origins, reader):
    """Prefer an API origin inside the first origin when that one is a module."""
    first = origins[0]
    if not is_module_key(first.key):
        return first
    for node in origins[1:]:
        cur, hops = reader.construct.get(node.key), 0
        while isinstance(cur, str) and hops < 256:
            if cur == first.key:
                return node
            cur, hops = reader.construct.get(cur), hops + 1
    return first


def analyze_overflow(root, progress=False):
    """Locate the first inf/nan in the dump under `root` (dump root, step dir or rank dir).

    Args:
        root: a dump tree with `step{N}/rank{R}` or `step{N}/proc{pid}` directories.
        progress: show a tqdm bar over the rank directories.

    Returns:
        OverflowAnalysis; empty when no value anywhere is inf or nan.

    Raises:
        MsprobeError: no dump below `root`; DumpFormatError: no dump.json is readable (a damaged one
            among readable ones is skipped and named in `skipped`).
    """
    if os.path.isfile(root) and os.path.basename(root) not in ("dump.json", "debug.json"):
        rank_dirs = [RankDir(root, 0, 0, False)]  # a dump.json saved under another name
    else:
        rank_dirs = find_rank_dirs(root)
    by_step = defaultdict(list)
    for rd in rank_dirs:
        by_step[rd.step].append(rd)
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(rank_dirs), desc="overflow_check", unit="rank dir")
    scanned, fallback, skipped = 0, None, []
    try:
        for step in sorted(by_step):
            scans = []
            for rd in by_step[step]:
                try:
                    reader, nodes = scan_rank(rd.path)
                except DumpFormatError as e:
                    if len(rank_dirs) == 1:
                        raise
                    skipped.append(f"{where(rd.step, rd.rank, rd.is_proc)}: skipped: {e}")
                    continue
                finally:
                    if bar is not None:
                        bar.update(1)
                scans.append((rd, reader, nodes))
                scanned += 1
            result = _analyze_step(scans)
            if result:
                return OverflowAnalysis(result, scanned, skipped)
            if fallback is None:
                fallback = _first_nonfinite(scans)
    finally:
        if bar is not None:
            bar.close()
    if not scanned:
        raise DumpFormatError(f"no rank directory could be read; first: {skipped[0]}")
    return OverflowAnalysis([fallback] if fallback else [], scanned, skipped)


def _analyze_step(scans):
    nonfinite_comm_inputs = {}
    for rd, _, nodes in scans:
        bad = [n for n in nodes if n.is_collective and not n.inputs_finite]
        nonfinite_comm_inputs[rd.rank] = {"keys": {n.key for n in bad}, "senders": any(n.is_sender for n in bad)}
    origins, received = [], []
    for rd, reader, nodes in scans:
        genuine, contaminated = [], False
        for node in nodes:
            if not node.is_origin:
                continue
            peers = _feeding_ranks(node, rd.rank, nonfinite_comm_inputs) if node.is_collective else set()
            if peers:
                received.append(_anomaly(RECEIVED, rd, reader, node, peers))
                contaminated = True
            elif not contaminated:
                # after a peer's inf arrived, later "origins" here are its echoes (saved tensors, in-place)
                genuine.append(node)
        if genuine:
            origins.append(_anomaly(ORIGIN, rd, reader, _innermost(genuine, reader)))
    if not origins:
        return []
    origins.sort(key=lambda a: (a.comm_before, a.index, a.rank))
    received.sort(key=lambda a: (a.rank, a.index))
    return origins + received


def _first_nonfinite(scans):
    hits = []
    for rd, reader, nodes in scans:
        for node in nodes:
            if not node.outputs_finite:
                hits.append(_anomaly(INHERITED, rd, reader, node))
                break
    hits.sort(key=lambda a: (a.comm_before, a.index, a.rank))
    return hits[0] if hits else None
