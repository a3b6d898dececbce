"""The import path msProbe's MindSpore documentation uses for the callbacks
(`from msprobe.mindspore.common.utils import MsprobeStep`)."""

from msprobe.mindspore.callbacks import MsprobeInitStep, MsprobeStep

__all__ = ["MsprobeStep", "MsprobeInitStep"]
