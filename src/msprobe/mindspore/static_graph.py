"""Static-graph dumps (GRAPH_MODE), and L2 anywhere: what MindSpore's CPU build allows.

    L2  MindSpore's own kernel-by-kernel dump, configured from config.json: we write
        {dump_path}/kernel_kbyk_dump.json and point MINDSPORE_DUMP_CONFIG at it before the first graph
        is compiled; MindSpore writes {dump_path}/rank_{r}/{net}/{graph}/{iteration}/
        {Op}.{scope}.{task}.{stream}.{timestamp}.{input|output}.{i}.{format}.{dtype}.npy. In PyNative this
        covers the mindspore.jit-compiled parts. The CPU build stores tensors only (task tensor).
    L0  Cells of a static graph are recorded with mindspore.ops.TensorDump, which the CPU build lacks;
        start() checks for it and says so.
"""

import json
import logging
import os
import tempfile

import mindspore as ms

from msprobe.core.errors import ConfigError, MsprobeError

logger = logging.getLogger(__name__)

KERNEL_DUMP_FILE = "kernel_kbyk_dump.json"


class StaticGraphUnsupported(MsprobeError):
    """A static-graph feature MindSpore's CPU build cannot provide."""


def _device():
    return ms.get_context("device_target")


def _iterations(steps):
    """Our step list as MindSpore's iteration syntax: "all", or "0|2-4"."""
    if not steps:
        return "all"
    runs, start, prev = [], steps[0], steps[0]
    for s in steps[1:] + [None]:
        if s is not None and s == prev + 1:
            prev = s
            continue
        runs.append(str(start) if start == prev else f"{start}-{prev}")
        if s is not None:
            start = prev = s
    return "|".join(runs)


class KernelDump:
    """Level L2: MindSpore's kernel dump, set up once; MindSpore counts the iterations itself."""

    def __init__(self, cfg):
        if cfg.task == "structure":
            raise ConfigError("task", "structure", "statistics | tensor at level L2 (kernel dump)")
        if cfg.task == "statistics" and _device() == "CPU":
            raise StaticGraphUnsupported(
                "level L2 with task statistics needs MindSpore's statistic kernel dump, which only its GPU "
                "and Ascend builds have; on the CPU build use task tensor")
        modes = set(cfg.data_mode)
        if modes & {"forward", "backward"}:
            raise ConfigError("data_mode", list(cfg.data_mode), '["all"], ["input"] or ["output"] at level L2')
        io = 1 if modes == {"input"} else 2 if modes == {"output"} else 0
        self.dump_path = os.path.abspath(cfg.dump_path)
        os.makedirs(self.dump_path, exist_ok=True)
        settings = {
            "common_dump_settings": {
                "dump_mode": 1 if cfg.list else 0, "path": self.dump_path, "net_name": "Net",
                "iteration": _iterations(cfg.step), "saved_data": "tensor" if cfg.task == "tensor" else "statistic",
                "input_output": io, "kernels": list(cfg.list), "support_device": list(range(8)),
                "op_debug_mode": 0},
            "e2e_dump_settings": {"enable": True, "trans_flag": True},
        }
        self.config_file = os.path.join(self.dump_path, KERNEL_DUMP_FILE)
        with open(self.config_file, "w", encoding="utf-8") as f:
            json.dump(settings, f, indent=1)
        os.environ["MINDSPORE_DUMP_CONFIG"] = self.config_file
        logger.info("msprobe: L2 kernel dump to %s (MindSpore dump config %s)", self.dump_path, self.config_file)

    def step(self):
        pass


def start_kernel_dump(cfg, step):
    return KernelDump(cfg)


def tensor_dump_missing():
    """The reason ops.TensorDump cannot run here, or None when it can (tried on a one-element graph)."""
    from mindspore import ops
    from msprobe.mindspore.numpy_compat import quiet_stderr
    dump = ops.TensorDump()
    try:
        with tempfile.TemporaryDirectory(prefix="msprobe_tensordump_") as probe_dir, quiet_stderr():

            @ms.jit
            def probe(x):
                dump(os.path.join(probe_dir, "probe"), x)
                return x

            probe(ms.Tensor([0.0], ms.float32)).asnumpy()
    except (RuntimeError, TypeError) as e:
        text = str(e).strip().splitlines()
        line = next((x.strip() for x in text if "TensorDump" in x), text[0] if text else repr(e))
        return line.split(", Please")[0]  # MindSpore's own advice follows; the first clause says it
    return None


def start_static(cfg, model, step):
    """start() in GRAPH_MODE."""
    if cfg.task == "overflow_check":
        raise ConfigError("task", "overflow_check", "statistics | tensor | structure in GRAPH_MODE (overflow_check "
                          "needs PYNATIVE_MODE)")
    if cfg.level == "L2":
        return KernelDump(cfg)
    if cfg.level != "L0":
        raise ConfigError("level", cfg.level, "L0 | L2 in GRAPH_MODE (static graph); L1, mix and debug need "
                          "PYNATIVE_MODE")
    missing = tensor_dump_missing()
    if missing is not None:
        raise StaticGraphUnsupported(
            f"level L0 in GRAPH_MODE records Cells with mindspore.ops.TensorDump, which this MindSpore build "
            f"({_device()}) cannot run ({missing}); use PYNATIVE_MODE for L0, or level L2 with task tensor")
    raise StaticGraphUnsupported(
        "level L0 in GRAPH_MODE on a device with TensorDump is not implemented by msprobe yet; use "
        "PYNATIVE_MODE for L0")
