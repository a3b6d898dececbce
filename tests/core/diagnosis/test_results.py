"""The typed results of a diagnosis and their writers: `diagnose` returns a Diagnosis of Suspects and
PairDiagnosis, diagnosis.json and the printout are rendered from them (and read back), and no output is
decided by reading a display cell back: a table whose Result or Diagnosis cells were rewritten changes
neither a CompareResult's truth nor the labels, counts or printout."""

import json

import numpy as np

from compare_fixtures import tensor, write_dump

from msprobe.core.compare.engine import compare_dumps
from msprobe.core.compare.rank_pairs import result_counts
from msprobe.core.diagnosis import Diagnosis, Evidence, PairDiagnosis, Suspect, diagnose, format_diagnosis



def _pair(tmp_path):
    """Three linear calls; golden's second one computes another output from the same inputs."""
    data = {f"Functional.linear.{i}.forward": {"input_args": [tensor(1.0 + i, -1.0, 0.1, 2.0 + i, shape=(4, 8))],
                                                "input_kwargs": {},
                                                "output": [tensor(2.0 + i, -2.0, 0.2, 4.0 + i, shape=(4, 3))]}
            for i in range(3)}
    golden = json.loads(json.dumps(data))
    golden["Functional.linear.1.forward"]["output"] = [tensor(9.0, -2.0, 0.2, 30.0, shape=(4, 3))]
    return (write_dump(tmp_path / "t", data), write_dump(tmp_path / "g", golden))


def test_diagnose_returns_typed_results_that_its_writers_render(tmp_path):
    results = compare_dumps(*_pair(tmp_path), progress=False)
    d = diagnose(results)
    assert isinstance(d, Diagnosis) and d.divergence
    top = d.suspects[0]
    assert isinstance(top, Suspect) and top.api == "Functional.linear.1.forward" and top.ranks == [0]
    assert all(isinstance(r, Evidence) for r in top.inputs + top.outputs) and top.outputs[0].diverges
    pair = d.pair(0, 0)
    assert isinstance(pair, PairDiagnosis) and pair.label_counts["introduces"] == 1
    # the labels are an array beside the typed rows, and the table's Diagnosis column is written from it
    assert isinstance(pair.labels, np.ndarray) and len(pair.labels) == len(results[0].rows)
    assert list(results[0].table["Diagnosis"]) == list(pair.labels)
    assert pair.labels[list(results[0].rows.target["name"]).index("Functional.linear.1.forward.output.0")] \
        == "introduces"
    doc = d.to_json()
    json.dumps(doc, allow_nan=False)
    assert doc["suspects"][0]["api"] == top.api and doc["ranks"][0]["labels"] == pair.label_counts
    assert dict(d) == doc and d["verdict"] == d.verdict  # it reads as diagnosis.json's mapping
    # diagnosis.json read back is the same account, printed the same
    again = Diagnosis.from_json(json.loads(json.dumps(doc)))
    assert again.to_json() == doc
    assert format_diagnosis(again) == format_diagnosis(d) and "Functional.linear.1.forward" in format_diagnosis(d)


def test_no_display_cell_is_read_back(tmp_path):
    results = compare_dumps(*_pair(tmp_path), progress=False)
    res = results[0]
    before = (bool(res), result_counts(res), format_diagnosis(diagnose(results)))
    assert not before[0] and before[1]["error"] == 1  # the second output's norm is far off: an error row
    errs = [i for i in range(len(res.rows)) if res.rows.verdicts.result[i] in ("error", "warning")]
    assert errs and json.loads(res.table["Err_message"][errs[0]]) == res.rows.verdicts.messages(errs[0])
    res.table["Result"] = "pass"
    res.table["Err_message"] = "[]"
    res.table["NPU Name"] = "renamed"
    res.table["Diagnosis"] = "agrees"
    assert (bool(res), result_counts(res), format_diagnosis(diagnose(results))) == before
    assert "introduces" in list(res.table["Diagnosis"])  # written again from the labels
