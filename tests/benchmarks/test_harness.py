"""benchmarks/harness.py: the interleaved rounds, ratios and options every overhead benchmark uses; and the
scripts built on it run in-process on their smallest settings (their numbers are not judged)."""

import argparse
import gc
import importlib
import os
import sys

import pytest

BENCH = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "benchmarks")
sys.path.insert(0, BENCH)
harness = importlib.import_module("harness")
sys.path.remove(BENCH)


def _slot(log, name, wall, cpu=None):
    def run():
        log.append(name)
        return [(wall, wall if cpu is None else cpu)]
    return run


def test_rounds_rotate_and_every_config_sits_between_two_baselines():
    log = []
    slots = {c: _slot(log, c, w) for c, w in (("a", 2.0), ("b", 3.0), ("c", 1.5))}
    per_config, base_all, redone = harness.interleave(_slot(log, "base", 1.0), slots, rounds=3)
    assert log[:7] == ["base", "a", "base", "b", "base", "c", "base"]
    assert log[7:14] == ["base", "b", "base", "c", "base", "a", "base"]  # the next round starts one later
    assert log[14:16] == ["base", "c"]
    assert len(base_all) == 3 * 4 and redone == 0
    assert harness.ratios(per_config["b"], base_all)["ratio"] == pytest.approx(3.0)
    assert [len(nb) for _, nb in per_config["a"]] == [2, 2, 2]  # its two neighbours, each round


def test_a_slot_whose_baselines_disagree_is_measured_again_and_the_best_try_kept():
    base_times = iter([1.0, 2.0, 1.9, 1.95, 5.0])  # the first try's neighbours differ 2x, the second's agree
    log = []
    per_config, base_all, redone = harness.interleave(lambda: [(next(base_times),) * 2],
                                                      {"a": _slot(log, "a", 4.0)}, rounds=1, retries=2,
                                                      settle=lambda: log.append("settle"))
    assert log == ["a", "settle", "a", "settle"] and redone == 1
    (got, neighbours), = per_config["a"]
    assert [s[0] for s in neighbours] == [2.0, 1.9]
    assert harness.ratios(per_config["a"], base_all)["ratio"] == pytest.approx(4.0 / 1.95)


def test_ratios_of_wall_and_cpu_time_and_their_second_opinions():
    rounds = [([(2.0, 1.0), (4.0, 1.0)], [(1.0, 1.0), (1.0, 0.5)]), ([(3.0, 3.0)], [(1.5, 1.0)])]
    base_all = [(1.0, 1.0), (1.0, 0.5), (1.5, 1.0)]
    wall = harness.ratios(rounds, base_all)
    assert wall["round_ratios"] == [3.0, 2.0] and wall["ratio"] == 2.5
    assert wall["ratio_of_medians"] == 3.0 and wall["ratio_of_mins"] == 2.0
    cpu = harness.ratios(rounds, base_all, harness.CPU)
    assert cpu["round_ratios"] == [1.0 / 0.75, 3.0] and cpu["ratio_of_mins"] == 2.0


def test_timed_steps_measure_wall_and_cpu_time_and_clean_up_outside():
    done = []
    got = harness.timed_steps(lambda: sum(range(200_000)), 3, before=lambda: done.append("b"),
                              after=lambda: done.append("a"))
    assert len(got) == 3 and all(w > 0 and c >= 0 for w, c in got)
    assert done == ["b", "a"] * 3


def test_rounds_collect_only_what_the_steps_made_and_leave_nothing_frozen():
    """Inside the rounds what was alive before is frozen: the collection before a step walks the steps'
    own objects, and still frees the cycles they make; after the rounds nothing is left frozen."""
    class Node:
        pass

    before, seen = gc.get_freeze_count(), {}

    def step():
        a, b = Node(), Node()
        a.b, b.a = b, a  # a cycle of the step's own: only the collector frees it
        seen.setdefault("frozen", gc.get_freeze_count())
        seen.setdefault("tracked", len(gc.get_objects()))
        seen["freed"] = seen.get("freed", 0) + gc.collect()
        return [(1.0, 1.0)]

    harness.interleave(step, {"a": step}, rounds=2)
    assert seen["frozen"] > before and seen["tracked"] < seen["frozen"] / 10
    assert seen["freed"] >= 4  # the cycles of the earlier steps (two objects and their __dict__s each)
    assert gc.get_freeze_count() == before


def test_common_options_quick_and_one_line_errors(capsys):
    p = argparse.ArgumentParser()
    harness.add_common_options(p, rounds=7, steps=3, quick=(2, 1))
    args = p.parse_args(["--quick"])
    harness.check_common_options(p, args)
    assert (args.rounds, args.steps, args.json, args.quiet) == (2, 1, None, False)
    with pytest.raises(SystemExit):
        harness.check_common_options(p, p.parse_args(["--rounds", "0"]))
    assert "--rounds: 0; must be >= 1" in capsys.readouterr().err
    with pytest.raises(argparse.ArgumentTypeError, match=r"unknown model \['x'\]; choose from a, b"):
        harness.parse_list("a,x", ("a", "b"), "model")
    # a script without timed steps (its samples from a child process or a browser) has no --steps/--threads
    p = argparse.ArgumentParser()
    harness.add_common_options(p, rounds=5, quick=(1,))
    args = p.parse_args(["--quick", "--json", "x.json"])
    harness.check_common_options(p, args)
    assert (args.rounds, args.json) == (1, "x.json") and not hasattr(args, "steps") and not hasattr(args, "threads")


def test_the_timing_scripts_take_the_common_options():
    """The scripts that time in rounds take --rounds/--quick/--json/--quiet from harness.py, not their own."""
    import re
    for name in ("acc_check_throughput", "compare_throughput", "compile_overhead", "diagnosis_cost", "dump_overhead",
                 "grad_probe_overhead", "graph_render", "host_cost", "monitor_overhead", "ms_dump_overhead"):
        with open(os.path.join(BENCH, name + ".py"), encoding="utf-8") as f:
            text = f.read()
        assert "harness.add_common_options(" in text, name
        assert not re.search(r"add_argument\(\"--(rounds|quick|quiet|json)\"", text), name


def test_every_overhead_script_imports_its_harness_and_models():
    """The PyTorch scripts import (the harness and the shared models are where they look for them)."""
    pytest.importorskip("torch")
    sys.path.insert(0, BENCH)
    try:
        for name in ("dump_overhead", "monitor_overhead", "grad_probe_overhead", "compile_overhead",
                     "host_cost", "acc_check_throughput"):
            module = importlib.import_module(name)
            assert callable(module.main), name
    finally:
        sys.path.remove(BENCH)
