"""A weight several calls read (an RNN's gates over time steps, a layer applied twice): each call's
backward record holds that call's share of the weight's gradient. Under autocast every call of the
region reads one cached cast of the weight, whose backward hands on the sum over all of them; the record
must still be the call's own share, as in the float32 run it is compared with."""

import pytest
import torch
import torch.nn.functional as F

from msprobe.core.dump.reader import DumpReader, find_rank_dirs
from msprobe.pytorch import PrecisionDebugger
import msprobe_test_models as models  # loaded by conftest.py


def _inputs():
    gen = torch.Generator().manual_seed(0)
    # the first call reads zeros (an RNN's initial state): its share of the weight's gradient is zero
    return [torch.zeros(3, 4)] + [torch.randn(3, 4, generator=gen) for _ in range(2)]


def _loss(outs):
    return sum((o.float() * (i + 1)).sum() for i, o in enumerate(outs))


@pytest.mark.parametrize("autocast", [None, torch.bfloat16])
def test_each_call_records_its_own_share_of_a_shared_weight(tmp_path, autocast):
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 4)
    xs = _inputs()
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="L1", task="statistics")
    try:
        dbg.start()
        with torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
            outs = [layer(x) for x in xs]
        _loss(outs).backward()
        dbg.stop()
        dbg.step()
    finally:
        models.finish(dbg)
    r = DumpReader(find_rank_dirs(str(tmp_path / "dump"))[0].path)

    # the reference: each call reads its own copy of the weight (cast as autocast casts it)
    low = autocast or torch.float32
    weights = [layer.weight.detach().to(low).requires_grad_() for _ in xs]
    biases = [layer.bias.detach().to(low).requires_grad_() for _ in xs]
    _loss([F.linear(x.to(low), w, b) for x, w, b in zip(xs, weights, biases)]).backward()
    for i, (w, b) in enumerate(zip(weights, biases)):
        rec = r[f"Functional.linear.{i}.backward"]["output"]
        models.assert_stats(rec[1], w.grad.float())
        models.assert_stats(rec[2], b.grad.float())
    assert r["Functional.linear.0.backward"]["output"][1]["Norm"] == 0.0
