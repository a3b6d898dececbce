"""What every overhead benchmark shares: timed steps (wall and process CPU time), interleaved rounds
against a baseline, medians and ratios, and the common command line (--rounds, --steps, --quick,
--json, --quiet, --threads; --record comes from results_file.py).

Interleaving: a round of one model is

    base, c1, base, c2, base, ..., cN, base        (each a slot of `steps` timed steps)

with the order of c1..cN rotated from one round to the next. A config's ratio in a round is its slot's
median over the median of the two `base` slots around it, and the reported ratio is the median over
rounds: pairing with the neighbouring baseline cancels slow drift in the machine's load, the median over
rounds drops the rounds that a burst still spoiled. Framework-free: a slot is any callable.
"""

import argparse
import contextlib
import gc
import json
import statistics
import sys
import time

WALL, CPU = 0, 1  # the two measures of a sample: (wall seconds, process CPU seconds of all threads)


def median(values):
    return statistics.median(values)


def timed(fn, *args):
    """(wall seconds, process CPU seconds) of one call of `fn`."""
    c0, t0 = time.process_time(), time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0, time.process_time() - c0


@contextlib.contextmanager
def young_heap():
    """Within it, what was alive on entry is frozen (`gc.freeze`): the collection before each timed step
    then walks only what the steps made since, not every object of the process (0.2-0.3 s a collection
    once torch._dynamo is imported, most of a quick run's time). Unfrozen on exit: a caller's later
    collections see everything again. Not nested (an inner exit would unfreeze the outer's objects)."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def timed_steps(step, steps, before=None, after=None):
    """`steps` samples of `step()`, a garbage collection before each outside the timed part (a step pays
    for its own garbage only); `before()` (waiting for the device) and `after()` (cleaning up) run
    around each, untimed."""
    got = []
    for _ in range(steps):
        gc.collect()
        if before is not None:
            before()
        got.append(timed(step))
        if after is not None:
            after()
    return got


def rotated(items, rnd):
    """`items` in the order of round `rnd`: rotated by one each round."""
    items = list(items)
    k = rnd % len(items) if items else 0
    return items[k:] + items[:k]


def spread(a, b):
    """How far apart two baseline slots are: max/min of their median wall times."""
    ma, mb = median(s[WALL] for s in a), median(s[WALL] for s in b)
    return max(ma, mb) / min(ma, mb)


def interleave(base_slot, slots, rounds, settle=None, retries=0, tolerance=1.25, on_round=None):
    """Interleaved rounds (see the module docstring). `base_slot()` and each `slots[name]()` return a
    list of samples; `settle()`, when given, runs untimed after each config slot (the aftermath of a heavy
    slot, freed memory and writeback, would otherwise slow the next baseline slot). When the two baseline
    slots around a config slot disagree by more than `tolerance`, the load changed while it ran: it is
    measured again, `retries` times at most, and the try whose neighbours agree best is kept.
    `on_round(rnd, per_config)` is called after each round.

    Returns ({name: [(samples, neighbouring baseline samples) per round]}, every baseline sample,
    the number of slots measured again)."""
    per_config = {name: [] for name in slots}
    base_all = []
    redone = 0
    with young_heap():
        for rnd in range(rounds):
            before = base_slot()
            base_all += before
            for name in rotated(slots, rnd):
                best = None
                for attempt in range(retries + 1):
                    got = slots[name]()
                    if settle is not None:
                        settle()
                    after = base_slot()
                    base_all += after
                    gap = spread(before, after)
                    if best is None or gap < best[0]:
                        best = (gap, got, before + after)
                    if gap <= tolerance:
                        break
                    redone += attempt < retries
                    before = after
                per_config[name].append((best[1], best[2]))
                before = after
            if on_round is not None:
                on_round(rnd, per_config)
    return per_config, base_all, redone


def ratios(rounds, base_all, metric=WALL):
    """A config's ratios for one measure from `interleave`'s rounds: `ratio` (the median of the per-round
    ratios), `round_ratios`, `ratio_of_medians` (all its samples over all baseline samples) and
    `ratio_of_mins` (fastest over fastest: robust to load as long as each side had one quiet step)."""
    flat = [s[metric] for got, _ in rounds for s in got]
    base = [s[metric] for s in base_all]
    paired = [median(s[metric] for s in got) / median(s[metric] for s in nb) for got, nb in rounds]
    return {"ratio": median(paired), "round_ratios": paired, "ratio_of_medians": median(flat) / median(base),
            "ratio_of_mins": min(flat) / min(base)}


def parse_list(value, allowed, what):
    """A comma list of names from `allowed` (an argparse type)."""
    items = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in items if v not in allowed]
    if bad or not items:
        raise argparse.ArgumentTypeError(f"unknown {what} {bad}; choose from {', '.join(allowed)}")
    return items


def add_common_options(parser, rounds, steps=None, quick=(2, 1), threads=None):
    """--rounds, --quick (CI smoke: `quick` = (rounds, steps), or (rounds,) for a script without steps),
    --json, --quiet; with `steps` (timed steps per slot) also --steps and, unless `threads` is False,
    --threads (torch's threads)."""
    parser.add_argument("--rounds", type=int, default=rounds, help=f"interleaved rounds (default {rounds})")
    if steps is not None:
        parser.add_argument("--steps", type=int, default=steps, help=f"timed steps per slot (default {steps})")
    smoke = f"--rounds {quick[0]}" + (f" --steps {quick[1]}" if steps is not None else "")
    parser.add_argument("--quick", action="store_true", help=f"CI smoke test: {smoke}; the numbers are rough")
    parser.add_argument("--json", metavar="PATH", help="also write the numbers as JSON")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    if steps is not None and threads is not False:
        parser.add_argument("--threads", type=int, default=threads,
                            help="torch.set_num_threads(N) (default: " + (f"{threads})" if threads else "torch's)"))
    parser.set_defaults(_quick=quick)


def check_common_options(parser, args):
    """Apply --quick and check the common options (one-line errors naming the flag)."""
    if args.quick:
        args.rounds = args._quick[0]
        if hasattr(args, "steps"):
            args.steps = args._quick[1]
    for flag in ("rounds", "steps", "threads"):
        value = getattr(args, flag, None)
        if value is not None and value < 1:
            parser.error(f"--{flag}: {value}; must be >= 1")


def logger(quiet):
    """Progress lines go to stderr (the tables go to stdout and into RESULTS.md)."""
    if quiet:
        return lambda msg: None
    return lambda msg: print(msg, file=sys.stderr, flush=True)


def write_json(path, data):
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
