"""What the PyTorch and MindSpore GradientMonitors share: config, step counter, writer and hook lifetime.

The adapters add `monitor(...)` (what to watch) and the hook that hands gradients to `_record`.
"""

from msprobe.core.errors import ConfigError
from msprobe.core.grad_probe.config import GradProbeConfig, load_grad_probe_config
from msprobe.core.grad_probe.writer import GradProbeWriter


class GradientMonitorBase:
    reducer_class = None  # the adapter's GradReducer(level, bounds)

    def __init__(self, config_path=None, *, config=None):
        if config is None:
            config = load_grad_probe_config(config_path)
        elif not isinstance(config, GradProbeConfig):
            raise ConfigError("config", type(config).__name__, "a GradProbeConfig")
        self.config = config
        self.current_step = 0
        self._step = 0  # the step being recorded
        self._handle = None
        self._writer = None
        self._reducer = self.reducer_class(config.grad_level, config.bounds)

    def _install(self, register):
        """Replace the hook by `register()`'s handle and open the writer."""
        if self._handle is not None:
            self._handle.remove()
        self._handle = register()
        if self._writer is None:
            self._writer = GradProbeWriter(self.config)

    def _next_step(self, rank):
        """Count one optimizer step; True when the config asks for it on this rank."""
        step, self.current_step = self.current_step, self.current_step + 1
        self._step = step
        return self.config.wants_step(step) and self.config.wants_rank(rank)

    def _record(self, rank, named_grads):
        """Reduce [(name, gradient)] of the current step and queue it for writing."""
        params = [(n, tuple(g.shape)) for n, g in named_grads]
        self._writer.submit(rank, self._step, params, self._reducer.reduce([g for _, g in named_grads]))

    def close(self):
        """Stop monitoring and finish writing."""
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def stop(self):
        """msProbe's name for finishing: `PrecisionDebugger(grad_probe config).stop()`."""
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
