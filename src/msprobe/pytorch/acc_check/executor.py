"""TorchExecutor: re-run one dumped API call on the device under test (its dumped dtypes) and on the
CPU in float64, forward and, when the dump has it, backward; hand back the arrays to compare.

The benchmark's inputs are the tested inputs upcast exactly (float -> float64, complex -> complex128),
so only the API's own error is measured. Gradients of the outputs come from the backward record
(dumped tensors or random data in its range) and are upcast the same way.
"""

import functools

import numpy as np
import torch

from msprobe.core.acc_check import dtypes
from msprobe.core.acc_check.execution import CaseExecutor, ComparedTensor, SkipCase, flat_outputs
from msprobe.core.acc_check.input_spec import TensorSpec, build_call, output_gradient_specs
from msprobe.core.errors import MsprobeError
from msprobe.pytorch.acc_check.random_apis import RANDOM_APIS
from msprobe.pytorch.acc_check.resolver import TorchResolver
from msprobe.pytorch.capture.api_table import is_inplace

_TORCH_DTYPES = {name: getattr(torch, name) for name in dtypes.DTYPES if hasattr(torch, name)}
_BENCH_DTYPES = {"float": torch.float64, "complex": torch.complex128}
_CPU = torch.device("cpu")
_GRAD_RANGE = (-1.0, 1.0)  # output gradient when the backward record does not describe one


def create_executor(device=None, custom_apis=(), threads=1, api_sources=None):
    """A TorchExecutor; threads=None leaves torch's thread count alone (see run_acc_check for why 1)."""
    return TorchExecutor(device, custom_apis, threads, api_sources)


def device_name(device):
    """How messages name a device: "CPU" (as MindSpore's executor and the CLI do), else "cuda:0", "npu:1"."""
    return "CPU" if device.type == "cpu" else str(device)


def pick_device(index=None):
    """The device under test: CUDA or NPU device `index` when there is one, else the CPU."""
    if torch.cuda.is_available():
        count, kind = torch.cuda.device_count(), "cuda"
    elif hasattr(torch, "npu") and torch.npu.is_available():
        count, kind = torch.npu.device_count(), "npu"
    else:
        return torch.device("cpu")
    index = 0 if index is None else index
    if not 0 <= index < count:
        raise MsprobeError(f"-d {index}: no such device; this machine has {count} {kind} device(s) "
                           f"(0..{count - 1})")
    return torch.device(kind, index)


def accelerator_count():
    if torch.cuda.is_available():
        return torch.cuda.device_count()
    if hasattr(torch, "npu") and torch.npu.is_available():
        return torch.npu.device_count()
    return 0


def _first_line(e):
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


def numpy_of(t):
    """A CPU numpy copy of a tensor; bf16/fp8 go through float32 (exact)."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.dtype in (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2):
        t = t.float()
    return t.resolve_conj().resolve_neg().contiguous().numpy()


class TorchExecutor(CaseExecutor):
    """Runs ApiCases of a PyTorch dump.

    Args:
        device: device index under test; None = accelerator 0 when there is one, else the CPU.
        custom_apis: ('Prefix=python.module', ...) for APIs registered with register_custom_api.
        threads: torch intra-op threads (set by multi-worker runs).
        api_sources: the dump's api_sources.json (where its custom APIs live), or None.
    """

    framework = "pytorch"

    def __init__(self, device=None, custom_apis=(), threads=None, api_sources=None):
        self.device = pick_device(device)
        self.device_name = device_name(self.device)
        self.resolver = TorchResolver(custom_apis, api_sources)
        self._threads_before = None  # set last: a bad option above leaves the caller's threads alone
        if threads:
            self._threads_before = torch.get_num_threads()
            torch.set_num_threads(threads)

    def close(self):
        """The caller's intra-op thread count back (run_acc_check runs in the caller's process)."""
        if self._threads_before is not None:
            torch.set_num_threads(self._threads_before)
            self._threads_before = None

    # -- one case ------------------------------------------------------------------------------
    def _random_api_reason(self, case, name):
        if name in RANDOM_APIS and self.device.type != "cpu":
            return (f"{case.prefix}.{case.api} draws random numbers; the {self.device.type} and CPU "
                    "generators differ, so its outputs cannot be compared")
        return None

    def _run(self, case, source, rng, run):
        func, tree, tensors, grad_index = self._prepare(case, source, rng, run, is_inplace)
        random_api = case.api.split(".", 1)[0] in RANDOM_APIS  # seeded alike for both runs on the CPU
        leaves_t, leaves_b = {}, {}
        for i, (key, spec) in enumerate(tensors):
            t = self._tested_tensor(run.inputs[key], spec)
            b = self._bench_tensor(t)
            if i in grad_index:
                t.requires_grad_(True)
                b.requires_grad_(True)
            leaves_t[id(spec)], leaves_b[id(spec)] = t, b
        args_t, kwargs_t = build_call(tree, leaves_t, functools.partial(_python_value, device=self.device))
        args_b, kwargs_b = build_call(tree, leaves_b, functools.partial(_python_value, device=_CPU))

        seed = int(rng.integers(0, 2**31 - 1))
        with torch.set_grad_enabled(bool(grad_index)):
            if random_api:
                torch.manual_seed(seed)
            try:
                out_t = func(*args_t, **kwargs_t)
            except Exception as e:
                dt = ", ".join(sorted({s.dtype_name for _, s in tensors})) or "no tensors"
                raise SkipCase(f"cannot run on {self.device_name} ({dt}): {_first_line(e)}") from None
            if random_api:
                torch.manual_seed(seed)
            try:
                out_b = func(*args_b, **kwargs_b)
            except Exception as e:
                raise SkipCase(f"benchmark on CPU in float64 failed: {_first_line(e)}") from None

        flat_t, flat_b = _flatten(out_t), _flatten(out_b)
        if len(flat_t) != len(flat_b):
            raise SkipCase(f"tested and benchmark runs returned {len(flat_t)} and {len(flat_b)} outputs")
        for (path, t), (_, b) in zip(flat_t, flat_b):
            run.forward.append(self._compared(f"{case.name}.forward.output.{path}", t, b))
        if grad_index:
            self._backward(case, source, rng, run, tensors, grad_index, leaves_t, leaves_b, flat_t, flat_b)

    def _backward(self, case, source, rng, run, tensors, grad_index, leaves_t, leaves_b, flat_t, flat_b):
        grad_specs = output_gradient_specs(case)
        outs_t, outs_b, grads_t, grads_b = [], [], [], []
        for j, ((_, t), (_, b)) in enumerate(zip(flat_t, flat_b)):
            if not (isinstance(t, torch.Tensor) and t.requires_grad and isinstance(b, torch.Tensor)
                    and b.requires_grad):
                continue
            spec = grad_specs[j] if j < len(grad_specs) else None
            if not isinstance(spec, TensorSpec) or spec.shape != tuple(t.shape):
                spec = TensorSpec(str(t.dtype).rsplit(".", 1)[-1], str(t.dtype), tuple(t.shape), _GRAD_RANGE[1],
                                  _GRAD_RANGE[0], None, None)
            key = f"backward.input.{j}"
            run.inputs[key] = source.array(spec, rng)
            g = self._tested_tensor(run.inputs[key], spec).to(t.dtype)
            outs_t.append(t)
            outs_b.append(b)
            grads_t.append(g)
            grads_b.append(self._bench_tensor(g).to(b.dtype))
        if not outs_t:
            run.backward_skip = "no output depends differentiably on the inputs"
            return
        inputs_t = [leaves_t[id(tensors[i][1])] for i in grad_index]
        inputs_b = [leaves_b[id(tensors[i][1])] for i in grad_index]
        try:
            got_t = _vjp(outs_t, inputs_t, grads_t)
        except Exception as e:
            run.backward_skip = f"backward cannot run on {self.device_name}: {_first_line(e)}"
            return
        try:
            got_b = _vjp(outs_b, inputs_b, grads_b)
        except Exception as e:
            run.backward_skip = f"benchmark backward on CPU in float64 failed: {_first_line(e)}"
            return
        for i, gt, gb in zip(grad_index, got_t, got_b):
            if gt is None or gb is None:
                continue
            run.backward.append(self._compared(f"{case.name}.backward.output.{i}", gt, gb))

    # -- pieces --------------------------------------------------------------------------------
    def _tested_tensor(self, array, spec):
        if not array.flags.c_contiguous:  # (np.ascontiguousarray would turn a 0-d array into 1-d)
            array = array.copy(order="C")
        t = torch.from_numpy(array)
        dtype = _TORCH_DTYPES.get(spec.dtype)
        if dtype is not None and t.dtype != dtype:
            t = t.to(dtype)
        return t.to(self.device) if self.device.type != "cpu" else t

    @staticmethod
    def _bench_tensor(t):
        t = t.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if t.is_floating_point():
            return t.to(torch.float64)
        if t.is_complex():
            return t.to(torch.complex128)
        return t.clone()

    @staticmethod
    def _compared(name, t, b):
        if isinstance(t, torch.Tensor) and isinstance(b, torch.Tensor):
            t, b = t.detach().contiguous(), b.detach().contiguous()  # numpy needs it: copy once, here
            identical = t.shape == b.shape and _identical(t, b)
            tested, bench = numpy_of(t), numpy_of(b)
            canonical = dtypes.canonical_dtype(str(t.dtype)) or "float32"
            return ComparedTensor(name, tested, bench, str(t.dtype), str(b.dtype), canonical, identical=identical)
        tested, bench = np.asarray(_number(t)), np.asarray(_number(b))
        canonical = dtypes.canonical_dtype(tested.dtype.name) or "float64"
        return ComparedTensor(name, tested, bench, type(t).__name__, type(b).__name__, canonical)


def _python_value(spec, device):
    v, kind = spec.value, spec.type_name
    if kind == "slice":
        return slice(*v)
    if kind == "ellipsis":
        return Ellipsis
    if kind == "torch.Size":
        return torch.Size(v)
    if kind == "torch.dtype":
        return getattr(torch, str(v).rsplit(".", 1)[-1])
    if kind == "torch.device":
        return device
    if kind == "torch.memory_format":
        return getattr(torch, str(v).rsplit(".", 1)[-1])
    if kind in ("list", "tuple"):
        return tuple(v)
    if kind == "float" and isinstance(v, str):
        return float(v)  # "inf" / "nan" written as strings
    return v


def _flatten(out):
    """(index path, value) of every tensor or number in an API's output (core's flat_outputs)."""
    return flat_outputs(out, torch.Tensor, (bool, int, float, complex))


def _identical(t, b):
    """tested == bench everywhere (nan where nan), compared in torch: cheap next to float64 metrics."""
    if t.device != b.device:
        t = t.cpu()
    ft, fb = t.reshape(-1), b.reshape(-1)
    if ft.numel() > 4096 and ft.dtype != fb.dtype and not torch.equal(ft[:1024].to(fb.dtype), fb[:1024]):
        return False  # most inexact outputs already differ near the start: skip the full conversion
    if t.dtype != b.dtype:
        try:
            t = t.to(b.dtype)
        except RuntimeError:
            return False
    if torch.equal(t, b):
        return True
    if t.is_floating_point() or t.is_complex():
        return bool(((t == b) | (torch.isnan(t) & torch.isnan(b))).all())
    return False


def _number(v):
    return float("nan") if v is None else v


def _vjp(outputs, inputs, grads):
    """`torch.autograd.grad(outputs, inputs, grads, allow_unused=True)` straight through autograd's
    engine. torch.autograd.grad first checks the given gradients against the outputs, and that check
    imports sympy (torch.fx.experimental.symbolic_shapes), again in every multi_acc_check worker.
    The gradients here are made from the outputs' own
    shapes and dtypes, so the check has nothing to find."""
    engine = getattr(torch.autograd.Variable, "_execution_engine", None)
    if engine is None:  # a torch without it: the public way
        return torch.autograd.grad(outputs, inputs, grads, allow_unused=True)
    return engine.run_backward(tuple(outputs), tuple(grads), False, False, tuple(inputs), True, False)
