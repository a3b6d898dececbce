"""pytorch/summary/ imports without a circle: the graph of its modules' imports of each other is acyclic,
and each module imports first, with none of the others loaded (triton_kernels where Triton is installed)."""

import ast
import importlib.util
import os
import subprocess
import sys

import msprobe.pytorch.summary as package

PACKAGE = "msprobe.pytorch.summary"
HERE = os.path.dirname(package.__file__)
MODULES = sorted(f[:-3] for f in os.listdir(HERE) if f.endswith(".py") and f != "__init__.py")


def _imports(name):
    """The package's modules that module `name` imports (at any depth of its code)."""
    with open(os.path.join(HERE, name + ".py"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == PACKAGE:
                found |= {a.name for a in node.names if a.name in MODULES}
            elif node.module.startswith(PACKAGE + "."):
                found.add(node.module.split(".")[3])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[3] for a in node.names if a.name.startswith(PACKAGE + ".")}
    return found - {name}


def test_the_import_graph_has_no_cycle():
    graph = {m: _imports(m) for m in MODULES}
    assert graph["summarizer"] and graph["device"], graph  # the parser sees imports
    done, path = set(), []

    def visit(m):
        assert m not in path, "import circle: " + " -> ".join(path[path.index(m):] + [m])
        if m in done:
            return
        path.append(m)
        for dep in sorted(graph[m]):
            visit(dep)
        path.pop()
        done.add(m)

    for m in MODULES:
        visit(m)


EACH_ALONE = """
import importlib, sys
import torch  # once: the package's modules are what is tried, each from nothing of the package
for name in sys.argv[1:]:
    for loaded in [k for k in sys.modules if k.startswith("msprobe.pytorch.summary.")]:
        del sys.modules[loaded]
    importlib.import_module(name)
print("IMPORTED", len(sys.argv) - 1)
"""


def test_each_module_imports_alone():
    have_triton = importlib.util.find_spec("triton") is not None
    names = [f"{PACKAGE}.{m}" for m in MODULES if m != "triton_kernels" or have_triton]
    proc = subprocess.run([sys.executable, "-c", EACH_ALONE, *names], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and f"IMPORTED {len(names)}" in proc.stdout, proc.stderr[-2000:]
