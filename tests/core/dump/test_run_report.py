"""What the debugger tells its user: where the dump goes (one line, MSPROBE_QUIET=1 silences it), a warning
for a filter that matched nothing (at close() or at exit), and a bad config raised from the constructor
as its message, not as a trace through msprobe."""

import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

from msprobe.core.errors import ConfigError
from msprobe.pytorch import PrecisionDebugger


def _train(dbg, model, steps=2, **start):
    for _ in range(steps):
        dbg.start(model, **start)
        model(torch.randn(2, 3)).sum().backward()
        dbg.stop()
        dbg.step()


def test_one_line_says_where_the_dump_goes(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("MSPROBE_QUIET", raising=False)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="mix")
    _train(dbg, nn.Linear(3, 3))
    dbg.close()
    err = capsys.readouterr().err.splitlines()
    said = [ln for ln in err if ln.startswith("msprobe: dumping")]
    (rank,) = os.listdir(tmp_path / "d" / "step0")
    assert said == [f"msprobe: dumping statistics mix to {tmp_path / 'd' / 'step0' / rank}"]
    monkeypatch.setenv("MSPROBE_QUIET", "1")
    quiet = PrecisionDebugger(dump_path=str(tmp_path / "q"), level="L1")
    _train(quiet, nn.Linear(3, 3))
    quiet.close()
    assert "msprobe: dumping" not in capsys.readouterr().err
    assert os.listdir(tmp_path / "q")  # silenced, not off


@pytest.mark.parametrize("field,value,start,said", [
    ("step", [5], {}, "the step filter [5] matched none of the steps run (0-1)"),
    ("rank", [3], {"rank_id": 0}, "the rank filter [3] matched no rank of this process (rank 0)"),
    ("list", ["Functional.nothing"], {}, "the list filter ['Functional.nothing'] matched no call"),
    ("scope", ["Module.a.A.forward.0", "Module.b.B.forward.0"], {}, "the scope filter"),
])
def test_a_filter_that_matches_nothing_is_said_at_close(tmp_path, caplog, field, value, start, said):
    cfg = {"task": "statistics", "level": "mix", "dump_path": str(tmp_path / "d")}
    if field in ("step", "rank"):
        cfg[field] = value
    else:
        cfg["statistics"] = {field: value}
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    dbg = PrecisionDebugger(config_path=str(tmp_path / "c.json"))
    with caplog.at_level(logging.WARNING):
        _train(dbg, nn.Linear(3, 3), **start)
        dbg.close()
        dbg.close()  # said once
    warned = [r.getMessage() for r in caplog.records if "matched no" in r.getMessage()]
    assert len(warned) == 1 and said in warned[0], warned


def test_a_filter_that_matches_something_is_not_said(tmp_path, caplog):
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1", step=[1])
    with caplog.at_level(logging.WARNING):
        _train(dbg, nn.Linear(3, 3), steps=3)
        dbg.close()
    assert not [r for r in caplog.records if "matched no" in r.getMessage()]


def test_one_string_stands_for_a_list_of_it(tmp_path):
    (tmp_path / "c.json").write_text(json.dumps({"task": "statistics", "level": "L1", "dump_path": str(tmp_path),
                                                 "statistics": {"list": "Functional.linear",
                                                                "data_mode": "forward"}}))
    dbg = PrecisionDebugger(config_path=str(tmp_path / "c.json"))
    assert list(dbg.config.list) == ["Functional.linear"] and list(dbg.config.data_mode) == ["forward"]
    with pytest.raises(ConfigError, match="statistics.list"):
        (tmp_path / "c.json").write_text(json.dumps({"task": "statistics", "statistics": {"list": [3]}}))
        PrecisionDebugger(config_path=str(tmp_path / "c.json"))


EXIT_SCRIPT = textwrap.dedent('''
    import sys, torch
    from msprobe.pytorch import PrecisionDebugger
    model = torch.nn.Linear(3, 3)
    dbg = PrecisionDebugger(dump_path=sys.argv[1], level="L1", step=[7])
    for _ in range(2):
        dbg.start(model)
        model(torch.randn(2, 3))
        dbg.stop()
        dbg.step()
    print("END")
''')

BAD_CONFIG = textwrap.dedent('''
    from msprobe.pytorch import PrecisionDebugger
    PrecisionDebugger(level="L7")
''')


def test_said_at_exit_without_close(tmp_path):
    script = tmp_path / "s.py"
    script.write_text(EXIT_SCRIPT)
    p = subprocess.run([sys.executable, str(script), str(tmp_path / "d")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "END" in p.stdout
    assert "msprobe: the step filter [7] matched none of the steps run (0-1): nothing was dumped" in p.stderr


def test_bad_config_is_its_message_raised_from_the_constructor(tmp_path):
    script = tmp_path / "s.py"
    script.write_text(BAD_CONFIG)
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 1
    assert lines[-1] == "msprobe.core.errors.ConfigError: config field 'level': got 'L7'; allowed: L0 | L1 | mix | debug | L2"
    assert len(lines) <= 8 and not any("config.py" in ln for ln in lines), p.stderr
