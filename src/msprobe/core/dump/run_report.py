"""What a debugger tells its user about a run: one line where the dump goes (at its first write), and,
at close() or exit, a warning for each filter that matched nothing (a `step`, `rank`, `scope` or `list`
that selects nothing writes nothing, which would otherwise pass for success).

`MSPROBE_QUIET=1` silences the line; the warnings go through logging (logger `msprobe.core.dump`).
Must not import torch or mindspore.
"""

import logging
import os
import sys

logger = logging.getLogger(__name__)


def _steps_text(steps):
    steps = sorted(steps)
    if not steps:
        return "none"
    return f"{steps[0]}-{steps[-1]}" if len(steps) > 1 else str(steps[0])


class RunReport:
    """One debugger's run, as far as its messages need it. Holds no reference to the debugger, so it can
    be finalised at exit (`weakref.finalize`) without keeping the debugger, or its model, alive."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.steps_started = set()  # steps start() was called in
        self.step_matched = False
        self.ranks_refused = set()  # ranks a session was not opened for (the rank filter)
        self.sessions = 0
        self.calls_matched = False
        self._announced = False
        self._finished = False

    def announce(self, rank_dir):
        """The first write of the run: say where the dump goes (once)."""
        if self._announced:
            return
        self._announced = True
        if os.environ.get("MSPROBE_QUIET", "0") != "1":
            print(f"msprobe: dumping {self.cfg.task} {self.cfg.level} to {os.path.abspath(rank_dir)}",
                  file=sys.stderr, flush=True)

    def quiet(self):
        """No "dumping to" line from here on (the flush at interpreter exit)."""
        self._announced = True

    def started(self, step, selected):
        self.steps_started.add(step)
        self.step_matched = self.step_matched or selected

    def session_opened(self):
        self.sessions += 1

    def rank_refused(self, rank):
        self.ranks_refused.add(rank)

    def session_closed(self, session):
        self.calls_matched = self.calls_matched or session.filter.hit

    def finish(self):
        """At close() or exit: a warning for each filter that matched nothing in the run (once)."""
        if self._finished or not self.steps_started:
            return
        self._finished = True
        cfg = self.cfg
        if cfg.step and not self.step_matched:
            logger.warning("msprobe: the step filter %s matched none of the steps run (%s): nothing was dumped",
                           cfg.step, _steps_text(self.steps_started))
        elif cfg.rank and not self.sessions and self.ranks_refused:
            this = ", ".join("no rank (not distributed)" if r is None else f"rank {r}" for r in self.ranks_refused)
            logger.warning("msprobe: the rank filter %s matched no rank of this process (%s): nothing was dumped",
                           cfg.rank, this)
        elif self.sessions and not self.calls_matched and (cfg.scope or cfg.list):
            which = " and the ".join(f"{name} filter {value}" for name, value in (("scope", cfg.scope),
                                                                                  ("list", cfg.list)) if value)
            logger.warning("msprobe: the %s matched no call in the steps dumped: nothing was recorded", which)
