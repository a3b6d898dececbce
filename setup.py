"""Build hook for the optional C extensions (everything else is in pyproject.toml).

`msprobe._moments` computes a tensor's min, max, sum and sum of squares in one pass (see its source);
`msprobe._crc` reads a tensor's CRC-32 in index order through a library's CRC function, views without a copy;
`msprobe._frames` walks the call stack for stack.json (core/stack.py); `msprobe._record` makes the
common records of PyTorch's Summarizer (pytorch/summary/summarizer.py), calling `_moments`' kernel through
its capsule; `msprobe._call` runs the flow of one recorded PyTorch API call (core/dump/call_capture.py's
`call`, pytorch/session.py); `msprobe._step_files` makes a step's directory and files in one call that holds no
GIL (core/dump/writer.py). All are optional: where no C compiler is at hand the build goes on without them and msprobe
falls back to the framework's own reductions, a Python frame walk and Python records. It is built with OpenMP where the compiler has it (in a PyTorch
process its threads are then torch's own), and with plain threads where it has not.
"""
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

OPENMP = ["-fopenmp"]


class BuildExt(build_ext):
    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception:  # noqa: BLE001 - any compiler/linker failure: try once more without OpenMP
            if OPENMP[0] not in ext.extra_compile_args:
                raise
            ext.extra_compile_args = [a for a in ext.extra_compile_args if a not in OPENMP]
            ext.extra_link_args = [a for a in ext.extra_link_args if a not in OPENMP]
            super().build_extension(ext)


setup(ext_modules=[Extension("msprobe._moments", ["src/msprobe/_native/moments.c"],
                             depends=["src/msprobe/_native/moments.h"],
                             extra_compile_args=["-O3"] + OPENMP, extra_link_args=OPENMP, optional=True),
                   Extension("msprobe._crc", ["src/msprobe/_native/crc.c"], depends=["src/msprobe/_native/crc.h"],
                             extra_compile_args=["-O2"] + OPENMP, extra_link_args=OPENMP, optional=True),
                   Extension("msprobe._frames", ["src/msprobe/_native/frames.c"], extra_compile_args=["-O2"],
                             optional=True),
                   Extension("msprobe._call", ["src/msprobe/_native/call.c", "src/msprobe/_native/edges.c"],
                             depends=["src/msprobe/_native/edges.h"], extra_compile_args=["-O2"],
                             optional=True),
                   Extension("msprobe._record", ["src/msprobe/_native/record.c"], extra_compile_args=["-O2"],
                             depends=["src/msprobe/_native/moments.h", "src/msprobe/_native/crc.h"], optional=True),
                   Extension("msprobe._step_files", ["src/msprobe/_native/step_files.c"], extra_compile_args=["-O2"],
                             optional=True)],
      cmdclass={"build_ext": BuildExt})
