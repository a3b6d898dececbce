"""Build hook for the one optional C extension (everything else is in pyproject.toml).

`msprobe._moments` computes a tensor's min, max, sum and sum of squares in one pass (see its source).
It is optional: where no C compiler is at hand the build goes on without it and msprobe falls back
to the framework's own reductions.
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("msprobe._moments", ["src/msprobe/_native/moments.c"],
                             extra_compile_args=["-O3"], optional=True)])
