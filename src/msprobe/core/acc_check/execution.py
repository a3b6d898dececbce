"""What a framework executor hands back for one API call, the part of it both frameworks share
(`CaseExecutor`), and how the runner finds executors.

An executor (`msprobe.pytorch.acc_check.executor.TorchExecutor`, the MindSpore one) re-runs an
ApiCase on the device under test in the dump's dtypes and on the CPU in float64, and returns the
pairs of arrays to compare. Everything after that (metrics, verdicts, files) is framework-neutral.
Must not import torch or mindspore; executors are loaded by module path in the process that runs them.
"""

import importlib
import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from msprobe.core.acc_check.api_names import Unresolvable
from msprobe.core.acc_check.input_spec import UnsupportedArgument, forward_inputs, gradient_inputs
from msprobe.core.dump.reader import iter_tensor_records
from msprobe.core.errors import DumpFormatError, MsprobeError

# Tensor elements one API may take as inputs and outputs together: 3e8 float32 elements are 1.2 GB each
# side and 2.4 GB more for the float64 benchmark; a recorded shape above it is refused, not allocated.
DEFAULT_MAX_ELEMENTS = 300_000_000

# framework (dump.json "framework") -> executor module; each has `create_executor(**options)`.
EXECUTOR_MODULES = {
    "pytorch": "msprobe.pytorch.acc_check.executor",
    "mindspore": "msprobe.mindspore.acc_check.executor",
    "mindtorch": "msprobe.pytorch.acc_check.executor",
}


@dataclass
class ComparedTensor:
    """One output (forward) or input gradient (backward) of the tested run and of the benchmark."""

    name: str  # details row name: `Functional.linear.0.forward.output.0`
    tested: np.ndarray
    bench: np.ndarray
    tested_dtype: str  # as the framework prints it: 'torch.bfloat16', 'BFloat16'
    bench_dtype: str
    dtype: str  # canonical tested dtype, for the dtype-aware verdict
    message: str = ""
    identical: bool = False  # the executor found tested == bench element for element (a fast path)


@dataclass
class CaseRun:
    """Everything an executor learned about one ApiCase.

    `backward` is None when the case has no backward to check. A non-empty `*_skip` says why that
    direction could not run here; its list is then empty.
    """

    forward: list = field(default_factory=list)
    backward: Optional[list] = None
    forward_skip: str = ""
    backward_skip: str = ""
    # For -save_error_data: the arrays fed to the API, keyed like tensor files
    # ("forward.input.0", "forward.input.weight", "backward.input.0").
    inputs: dict = field(default_factory=dict)


def executor_module(framework):
    """The adapter module that checks a `framework` dump's APIs (imports that framework).

    Raises:
        MsprobeError: no adapter for this framework, or the framework is not installed.
    """
    module_path = EXECUTOR_MODULES.get(framework)
    if module_path is None:
        raise MsprobeError(f"dump framework {framework!r}: acc_check supports {' | '.join(sorted(EXECUTOR_MODULES))}")
    try:
        return importlib.import_module(module_path)
    except ImportError as e:
        raise MsprobeError(f"acc_check for a {framework} dump needs {framework} installed ({e})") from None


@dataclass(frozen=True)
class ExecutorSpec:
    """How to build an executor in any process (picklable for spawn workers)."""

    framework: str
    options: tuple = ()  # (name, value) pairs passed to create_executor; "max_elements" sets the case limit

    def create(self, **overrides):
        module = executor_module(self.framework)
        options = {**dict(self.options), **overrides}
        max_elements = options.pop("max_elements", None)
        executor = module.create_executor(**options)
        executor.max_elements = max_elements or DEFAULT_MAX_ELEMENTS
        return executor


class SkipCase(Exception):
    """The case cannot be checked here; the message (a SKIP row's) says exactly why."""


class CaseExecutor:
    """What the frameworks' executors share: one case in, one CaseRun out, a SkipCase turned into the
    SKIP reason of both directions; and the preparation every case starts with.

    A subclass sets `resolver` (an api_names.ApiResolver) and implements `_run(case, source, rng, run)`.
    """

    resolver = None
    max_elements = DEFAULT_MAX_ELEMENTS

    def run(self, case, source, rng):
        run = CaseRun(backward=[] if case.backward else None)
        try:
            self._run(case, source, rng, run)
        except SkipCase as e:
            run.forward, run.backward = [], ([] if case.backward else None)
            run.forward_skip = str(e)
            run.backward_skip = str(e) if case.backward else ""
        return run

    def _run(self, case, source, rng, run):
        raise NotImplementedError

    def close(self):
        """Give back what the executor changed in its process (a run in the caller's own process)."""

    def _random_api_reason(self, case, name):
        """Why API `name` cannot be compared because it draws random numbers, or None when it can."""
        return None

    def _prepare(self, case, source, rng, run, in_place):
        """(func, tree, named, grad_index): the API resolved; its (args, kwargs) spec tree for
        input_spec.build_call; its tensor inputs [(key, TensorSpec)], drawn into `run.inputs`; the
        positions in `named` whose gradient is checked (none for an API `in_place(name)` calls in-place)."""
        try:
            func = self.resolver.resolve_case(case)
        except Unresolvable as e:
            raise SkipCase(str(e)) from None
        try:
            tree, named = forward_inputs(case)
            too_big = oversized(case, self.max_elements)
        except UnsupportedArgument as e:
            raise SkipCase(str(e)) from None
        if too_big:
            raise SkipCase(too_big)
        name = case.api.split(".", 1)[0]
        reason = self._random_api_reason(case, name)
        if reason:
            raise SkipCase(reason)
        try:
            for key, spec in named:
                run.inputs[key] = source.array(spec, rng)
        except DumpFormatError as e:  # an unreadable or inconsistent tensor file: this API only
            raise SkipCase(str(e)) from None
        inplace = in_place(name)
        if case.backward and inplace:
            run.backward_skip = "in-place API: its input is overwritten, no gradient to compare"
        grad_index = gradient_inputs(case, named) if case.backward and not inplace else []
        return func, tree, named, grad_index


def flat_outputs(out, tensor_type, scalars, path=""):
    """(index path, value) of every tensor (`tensor_type`) or number (`scalars`) in an API's output, nested
    lists and tuples walked in order; the path names the output as its compare row does ("0", "1.0")."""
    if isinstance(out, tensor_type):
        return [(path or "0", out)]
    if isinstance(out, (list, tuple)):
        items = []
        for i, v in enumerate(out):
            items += flat_outputs(v, tensor_type, scalars, f"{path}.{i}" if path else str(i))
        return items
    if isinstance(out, scalars):
        return [(path or "0", out)]
    return []


def oversized(case, limit):
    """Why a case's recorded tensors are too big to build (one line), or "" when they fit in `limit`
    elements (inputs and outputs together, as the run holds them all at once)."""
    fwd = case.forward
    shapes = [r["shape"] for _, r in iter_tensor_records([fwd.get(k) for k in ("input_args", "input_kwargs", "output")])
              if isinstance(r.get("shape"), list) and all(isinstance(n, int) and n >= 0 for n in r["shape"])]
    sizes = [math.prod(shape) for shape in shapes]
    total = sum(sizes)
    if total <= limit:
        return ""
    biggest = shapes[sizes.index(max(sizes))]
    return (f"refused: its tensors hold {total:,} elements (largest {biggest}), over the limit of "
            f"{limit:,} (--max-elements)")
