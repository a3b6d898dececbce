"""Build the graph outputs of a dump (one graph) or of two dumps (compared): the page and the data.

    visualize("dump/step0/rank0", "out")                          # one graph
    visualize("run_a/step0", "out", golden_path="run_b/step0")    # compared, per rank

The comparison itself (matching, metrics, pass/warning/error) is `msprobe.core.compare`'s; the
"start here" node is its diagnosis. Must not import torch or mindspore.
"""

import logging
import os
import time
from dataclasses import dataclass

from msprobe.core.dump.reader import find_rank_dirs, load_stack
from msprobe.core.errors import DumpFormatError, MsprobeError, none_readable, where
from msprobe.core.graph.document import compare_graph_json, graph_document, single_graph_json
from msprobe.core.graph.hierarchy import graph_from_dump
from msprobe.core.graph.merge import merge_compare
from msprobe.core.graph.database import write_database
from msprobe.core.graph.page import render_page
from msprobe.core.safe_files import FILE_MODE, make_dirs, open_text

log = logging.getLogger(__name__)


@dataclass
class GraphOutputs:
    """What `visualize` wrote: the page, the SQLite file for other tools, and the document itself."""

    html_path: str
    db_path: str
    document: dict
    pairing: tuple = ()   # how runs were chosen among several proc{pid} runs, one line per step
    skipped: tuple = ()   # one line per step and rank whose dump could not be read (the others are drawn)


def rank_dirs_for_graph(path):
    """Rank directories under `path`; `proc{pid}` helper dirs are dropped when real ranks exist."""
    dirs = find_rank_dirs(path)
    ranks = [d for d in dirs if not d.is_proc]
    return ranks or dirs


def visualize(target_path, output_path, golden_path=None, layer_mapping=None, fuzzy_match=False,
              overflow_check=False, stack_path=None, progress=True, target_run=None, golden_run=None):
    """Build the graph page and document for a target dump, compared with a golden dump when given.

    Args:
        target_path: rank dir, step dir (all its ranks) or dump root (all steps), or a dump.json.
        output_path: folder for `build_{ts}.html` / `compare_{ts}.html` and the matching `.vis.db`.
        golden_path: the dump to compare with; None builds one graph.
        layer_mapping: path of a layer-mapping YAML for cross-framework or renamed layers.
        fuzzy_match: match APIs ignoring call indexes (compare's `-fm`).
        overflow_check: mark nodes whose statistics hold inf/nan.
        stack_path: a stack.json to use instead of the one next to dump.json (single rank).
        progress: show a progress bar.
        target_run, golden_run: which of several proc{pid} runs of a step to compare (compare's).

    Returns:
        GraphOutputs.

    Raises:
        MsprobeError: a dump is missing, has no hierarchy (level L1) or the compare failed; no rank dir
            could be read. A damaged one among readable ones is skipped and named in `skipped`.
    """
    from tqdm import tqdm
    for flag, value in (("-tp", target_path), ("-gp", golden_path), ("-lm", layer_mapping)):
        if value is not None and not os.path.exists(value):
            raise MsprobeError(f"{flag} '{value}': no such file or directory")
    skipped, errors = [], []

    def readable(d):
        """d's graph, or None (the damage noted in `skipped`, its error in `errors`)."""
        try:
            return graph_from_dump(d.path)
        except DumpFormatError as e:
            skipped.append(f"{where(d.step, d.rank, d.is_proc)}: skipped: {e}")
            errors.append(e)
            return None

    targets = rank_dirs_for_graph(target_path)
    if stack_path is not None and len(targets) > 1:
        raise MsprobeError(f"stack_path '{stack_path}': only for a single-rank dump; '{target_path}' "
                           f"holds {len(targets)} rank directories")
    graphs = {}
    for d in tqdm(targets, desc="hierarchy", unit="rank", disable=not progress or len(targets) < 2):
        graph = readable(d)
        if graph is not None:
            graphs[_norm(d.path)] = (d, graph)
    if not graphs:
        raise MsprobeError(none_readable(errors, skipped))
    if stack_path is not None:
        only = next(iter(graphs.values()))[1]
        only.stacks = load_stack(stack_path)
    if golden_path is None:
        entries = [single_graph_json(g, d.step, d.rank, overflow_check) for d, g in graphs.values()]
        doc = graph_document(entries, "build")
        out = _write(doc, output_path, "build")
        out.skipped = tuple(skipped)
        return out
    goldens = {_norm(d.path): readable(d)  # fails fast on an L1 golden, before the compare
               for d in rank_dirs_for_graph(golden_path)}
    compare_skipped = []

    from msprobe.core.compare.engine import compare_dumps
    results = compare_dumps(target_path, golden_path, fuzzy_match=fuzzy_match, layer_mapping=layer_mapping,
                            stack_path=stack_path, progress=progress, target_run=target_run, golden_run=golden_run,
                            skipped=compare_skipped)
    skipped += [line for line in compare_skipped if line not in skipped]
    results = [r for r in results if _norm(r.target_dir) in graphs and goldens.get(_norm(r.golden_dir), 1)]
    if not results:
        raise MsprobeError(f"compare '{target_path}' with '{golden_path}': no step/rank pair to compare")
    diagnosis = _diagnose(results)
    entries = []
    for res in tqdm(results, desc="graph", unit="rank", disable=not progress or len(results) < 2):
        key = _norm(res.target_dir)
        target = graphs[key][1] if key in graphs else graph_from_dump(res.target_dir)
        golden = goldens.get(_norm(res.golden_dir)) or graph_from_dump(res.golden_dir)
        pair = diagnosis.pair(res.step, res.rank) if diagnosis is not None else None
        merged = merge_compare(target, golden, res, pair.labels if pair is not None else None)
        entries.append(compare_graph_json(merged, res.step, res.rank, res.mode, overflow_check,
                                          _suspects_for(diagnosis, res.step, res.rank)))
    doc = graph_document(entries, "compare", diagnosis=diagnosis.to_json() if diagnosis is not None else None)
    out = _write(doc, output_path, "compare")
    out.pairing = tuple(dict.fromkeys(r.pairing for r in results if r.pairing))
    out.skipped = tuple(skipped)
    return out


def _norm(path):
    path = os.path.abspath(path)
    return os.path.dirname(path) if os.path.isfile(path) else path


def _diagnose(results):
    """The compare diagnosis, or None when it cannot run (the graph is still useful without it)."""
    try:
        from msprobe.core.diagnosis import diagnose
    except ImportError:
        log.warning("diagnosis unavailable: no 'start here' node")
        return None
    return diagnose(results)


def _suspects_for(diagnosis, step, rank):
    """Ranked (name, reason) of the diagnosis suspects that belong to this step and rank."""
    if diagnosis is None:
        return []
    return [(s.api, s.reason or "") for s in diagnosis.suspects if s.step == step and rank in s.ranks]


def _write(doc, output_path, kind):
    make_dirs(output_path)
    stem = os.path.join(output_path, f"{kind}_{time.strftime('%Y%m%d%H%M%S')}")
    n = 1
    while os.path.exists(stem + ".html") or os.path.exists(stem + ".vis.db"):  # same second: keep both
        n += 1
        stem = os.path.join(output_path, f"{kind}_{time.strftime('%Y%m%d%H%M%S')}_{n}")
    db_path, html_path = stem + ".vis.db", stem + ".html"
    write_database(doc, db_path)  # a fresh file (a link there is removed, not followed)
    os.chmod(db_path, FILE_MODE)
    with open_text(html_path) as f:
        f.write(render_page(doc, title=f"msprobe {kind} graph"))
    return GraphOutputs(html_path, db_path, doc)

