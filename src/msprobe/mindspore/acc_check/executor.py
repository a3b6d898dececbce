"""MindSporeExecutor: re-run one dumped API call in its dumped dtypes and in float64, forward and,
when the dump has it, backward (`mindspore.vjp` with the recorded or generated output gradients).

The benchmark's inputs are the tested inputs upcast exactly to float64. Both runs use the process's
device target: on a CPU-only install that is the CPU; with Ascend the tested run is on the NPU and
the float64 benchmark runs where MindSpore places float64 kernels.
"""

import numpy as np

import msprobe.mindspore  # noqa: F401  (numpy 2 compatibility shim: must run before the first op)
import mindspore as ms

from msprobe.core.acc_check import dtypes
from msprobe.core.acc_check.execution import CaseExecutor, ComparedTensor, SkipCase, flat_outputs
from msprobe.core.acc_check.input_spec import TensorSpec, build_call, output_gradient_specs
from msprobe.mindspore.acc_check.resolver import MindSporeResolver
from msprobe.mindspore.capture.api_table import is_in_place

_MS_DTYPES = {"float64": ms.float64, "float32": ms.float32, "float16": ms.float16, "bfloat16": ms.bfloat16,
              "int8": ms.int8, "int16": ms.int16, "int32": ms.int32, "int64": ms.int64, "uint8": ms.uint8,
              "bool": ms.bool_, "complex64": ms.complex64, "complex128": ms.complex128}
_FLOATS = (ms.float16, ms.float32, ms.bfloat16, ms.float64)
_RANDOM = frozenset({"dropout", "dropout2d", "dropout3d", "rand", "randn", "randint", "randperm", "rand_like",
                     "randn_like", "randint_like", "bernoulli", "multinomial", "normal", "uniform"})
_GRAD_RANGE = (-1.0, 1.0)


def create_executor(device=None, custom_apis=(), threads=None, api_sources=None):
    return MindSporeExecutor(device, custom_apis, threads, api_sources)


def accelerator_count():
    return 0 if ms.get_context("device_target") == "CPU" else 1


def _first_line(e):
    text = [ln for ln in str(e).strip().splitlines() if ln.strip() and not ln.startswith("-")]
    first = text[0] if text else ""
    return f"{type(e).__name__}: {first.split(', , ')[0]}"[:300]  # MindSpore appends abstract values


def numpy_of(t):
    if t.dtype == ms.bfloat16:
        t = t.astype(ms.float32)
    a = t.asnumpy()
    return a if a.flags.c_contiguous else a.copy(order="C")  # (ascontiguousarray makes 0-d arrays 1-d)


class MindSporeExecutor(CaseExecutor):
    """Runs ApiCases of a MindSpore dump.

    Args:
        device: device id under test (Ascend); ignored on a CPU-only install.
        custom_apis: ('Prefix=python.module', ...) for APIs registered with register_custom_api.
        threads: accepted for the runner's interface; MindSpore keeps its own thread settings.
        api_sources: the dump's api_sources.json (Primitive arguments, custom API modules), or None.
    """

    framework = "mindspore"

    def __init__(self, device=None, custom_apis=(), threads=None, api_sources=None):
        target = ms.get_context("device_target")
        if target != "CPU" and device is not None:
            ms.set_device(target, device)
        self.device_name = target if device is None or target == "CPU" else f"{target}:{device}"
        self.resolver = MindSporeResolver(custom_apis, api_sources)

    def _random_api_reason(self, case, name):
        if name in _RANDOM:
            return f"{case.prefix}.{case.api} draws random numbers: its outputs cannot be compared"
        return None

    def _run(self, case, source, rng, run):
        func, tree, named, grad_index = self._prepare(case, source, rng, run, is_in_place)
        tested = {id(spec): self._tensor(run.inputs[key], spec) for key, spec in named}
        bench = {k: _upcast(t) for k, t in tested.items()}
        # a rebuilt Primitive may have a float64 benchmark of its own that gives some of its outputs
        bench_func = getattr(func, "bench", func)
        compared = getattr(func, "compared_outputs", None)

        def call(leaves, api):
            def fn(*diff_values):
                values = dict(leaves)
                for i, v in zip(grad_index, diff_values):
                    values[id(named[i][1])] = v
                args, kwargs = build_call(tree, values, _value)
                return api(*args, **kwargs)
            return fn

        def outputs(out, of_bench):
            flat = _flatten(out)
            return flat if of_bench or compared is None else [flat[i] for i in compared if i < len(flat)]

        try:
            out_t = call(tested, func)()
        except Exception as e:
            dt = ", ".join(sorted({s.dtype_name for _, s in named})) or "no tensors"
            raise SkipCase(f"cannot run on {self.device_name} ({dt}): {_first_line(e)}") from None
        try:
            out_b = call(bench, bench_func)()
        except Exception as e:
            raise SkipCase(f"benchmark in float64 failed: {_first_line(e)}") from None
        flat_t, flat_b = outputs(out_t, False), outputs(out_b, True)
        if len(flat_t) != len(flat_b):
            raise SkipCase(f"tested and benchmark runs returned {len(flat_t)} and {len(flat_b)} outputs")
        for (path, t), (_, b) in zip(flat_t, flat_b):
            run.forward.append(_compared(f"{case.name}.forward.output.{path}", t, b))
        if grad_index:
            self._backward(case, source, rng, run, named, grad_index, tested, bench,
                           (call(tested, func), call(bench, bench_func)), outputs, compared, flat_t, flat_b)

    def _backward(self, case, source, rng, run, named, grad_index, tested, bench, fns, outputs, compared, flat_t,
                  flat_b):
        grad_specs = output_gradient_specs(case)
        sens_t, sens_b, picked = [], [], []
        for j, (_, t) in enumerate(flat_t):
            if not (isinstance(t, ms.Tensor) and t.dtype in _FLOATS):
                continue
            k = compared[j] if compared else j  # the output's place among all the API's outputs
            spec = grad_specs[k] if k < len(grad_specs) else None
            if not isinstance(spec, TensorSpec) or spec.shape != tuple(t.shape):
                canonical = dtypes.canonical_dtype(str(t.dtype)) or "float32"
                spec = TensorSpec(canonical, str(t.dtype), tuple(t.shape), _GRAD_RANGE[1], _GRAD_RANGE[0], None, None)
            key = f"backward.input.{k}"
            run.inputs[key] = source.array(spec, rng)
            g = self._tensor(run.inputs[key], spec).astype(t.dtype)
            sens_t.append(g)
            sens_b.append(_upcast(g).astype(flat_b[j][1].dtype))  # a cast API's bench output is not float64
            picked.append(j)
        if not picked:
            run.backward_skip = "no floating-point output to differentiate"
            return
        got = []
        for leaves, sens, fn, of_bench, label in ((tested, sens_t, fns[0], False, "tested"),
                                                  (bench, sens_b, fns[1], True, "benchmark")):
            diff = [leaves[id(named[i][1])] for i in grad_index]

            def selected(*xs, fn=fn, of_bench=of_bench):
                flat = outputs(fn(*xs), of_bench)
                return tuple(flat[j][1] for j in picked)
            try:
                _, vjp_fn = ms.vjp(selected, *diff)
                grads = vjp_fn(tuple(sens))
            except Exception as e:
                run.backward_skip = f"{label} backward failed: {_first_line(e)}"
                return
            got.append(grads if isinstance(grads, tuple) else (grads,))
        for i, gt, gb in zip(grad_index, got[0], got[1]):
            if gt is None or gb is None:
                continue
            run.backward.append(_compared(f"{case.name}.backward.output.{i}", gt, gb))

    @staticmethod
    def _tensor(array, spec):
        dtype = _MS_DTYPES.get(spec.dtype)
        if dtype == ms.bfloat16:
            return ms.Tensor(np.asarray(array, np.float32)).astype(ms.bfloat16)
        t = ms.Tensor(np.ascontiguousarray(array) if array.ndim else array)
        return t.astype(dtype) if dtype is not None and t.dtype != dtype else t


def _upcast(t):
    if t.dtype in _FLOATS:
        return t.astype(ms.float64)
    if t.dtype == ms.complex64:
        return t.astype(ms.complex128)
    return t


def _value(spec):
    v, kind = spec.value, spec.type_name
    if kind == "slice":
        return slice(*v)
    if kind == "ellipsis":
        return Ellipsis
    if kind in ("mindspore.dtype", "mindspore.common.dtype.Type", "torch.dtype"):
        name = dtypes.canonical_dtype(str(v))
        return _MS_DTYPES.get(name, v)
    if kind in ("list", "tuple", "torch.Size"):
        return tuple(v)
    if kind == "float" and isinstance(v, str):
        return float(v)
    return v


def _flatten(out):
    """(index path, value) of every tensor or number in an API's output (core's flat_outputs)."""
    return flat_outputs(out, ms.Tensor, (bool, int, float))


def _compared(name, t, b):
    if isinstance(t, ms.Tensor) and isinstance(b, ms.Tensor):
        tested, bench = numpy_of(t), numpy_of(b)
        canonical = dtypes.canonical_dtype(str(t.dtype)) or "float32"
        identical = tested.shape == bench.shape and np.array_equal(tested, bench, equal_nan=tested.dtype.kind in "fc")
        return ComparedTensor(name, tested, bench, str(t.dtype), str(b.dtype), canonical, identical=identical)
    tested, bench = np.asarray(t), np.asarray(b)
    canonical = dtypes.canonical_dtype(tested.dtype.name) or "float64"
    return ComparedTensor(name, tested, bench, type(t).__name__, type(b).__name__, canonical)
