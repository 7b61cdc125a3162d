"""The package as users install it: the names it installs, imports from any folder without the
CuTe DSL, its CPU path without the GPU stack (installed on Linux only), no edits of the module
search path, no import cycles, no private names across modules, the oracle kept out of the
library, and the Blackwell template running copied alone.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "fp4_ops"
TEMPLATE = ROOT / "blockwise_gemm_fp4.py"
# its grouped sibling, which extends it (so it is copied together with it)
GROUPED_TEMPLATE = ROOT / "blockwise_grouped_gemm_fp4.py"
# the one place that may import the oracle: the standalone template's GPU run, from beside it
ORACLE_USERS = {("blockwise_gemm_fp4", "reference_beside_this_file")}


def _library_modules() -> dict[str, Path]:
    """Module name -> file of every module of the installed library."""
    modules = {"blockwise_gemm_fp4": TEMPLATE, "blockwise_grouped_gemm_fp4": GROUPED_TEMPLATE}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    return modules


def _imports(path: Path):
    """(imported module, names taken from it, enclosing function or None) of every import."""
    tree = ast.parse(path.read_text())
    found = []

    def visit(node, function):
        for child in ast.iter_child_nodes(node):
            scope = child.name if isinstance(child, ast.FunctionDef) else function
            if isinstance(child, ast.Import):
                found.extend((alias.name, [], scope) for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0:
                found.append((child.module, [a.name for a in child.names], scope))
            visit(child, scope)

    visit(tree, None)
    return found


def _edges(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the library modules it imports (at module level or inside functions)."""
    edges = {}
    for name, path in modules.items():
        targets = set()
        for module, names, _ in _imports(path):
            for target in [f"{module}.{n}" for n in names] + [module]:
                if target in modules and target != name:
                    targets.add(target)
                    break
        edges[name] = targets
    return edges


def test_library_modules_are_found():
    modules = _library_modules()
    for name in ("fp4_ops", "fp4_ops.ops", "fp4_ops.cpu", "fp4_ops.sm90.gemm", "fp4_ops.sm90.cli"):
        assert name in modules
    assert "fp4_ops.ops" in _edges(modules)["fp4_ops"]


def test_the_house_has_no_import_cycle():
    edges = _edges(_library_modules())
    done, stack = set(), []

    def walk(node):
        if node in stack:
            pytest.fail("import cycle: " + " -> ".join(stack[stack.index(node) :] + [node]))
        if node in done:
            return
        stack.append(node)
        for target in sorted(edges[node]):
            walk(target)
        stack.pop()
        done.add(node)

    for node in sorted(edges):
        walk(node)


def test_no_private_name_crosses_a_module():
    modules = _library_modules()
    crossing = []
    for name, path in modules.items():
        for module, names, _ in _imports(path):
            if module in modules or module == "reference":
                crossing += [f"{name}: from {module} import {n}" for n in names if n[:1] == "_"]
        tree = ast.parse(path.read_text())
        aliases = {
            alias.asname or alias.name
            for node in ast.walk(tree)
            if isinstance(node, (ast.Import, ast.ImportFrom))
            for alias in node.names
            if f"{getattr(node, 'module', None)}.{alias.name}" in modules or alias.name in modules
        }
        inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        for node in ast.walk(tree):
            chain = [] if id(node) in inner else _attribute_chain(node)
            if chain and chain[0] in aliases and any(_private(a) for a in chain[1:]):
                crossing.append(f"{name}: {'.'.join(chain)}")
    assert crossing == []


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _attribute_chain(node) -> list[str]:
    """``a.b.c`` as ["a", "b", "c"] for the outermost Attribute of a chain over a Name, else []."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return [node.id, *reversed(parts)] if parts and isinstance(node, ast.Name) else []


def test_library_code_never_imports_the_oracle():
    users = {
        (name, function)
        for name, path in _library_modules().items()
        for module, _, function in _imports(path)
        if module == "reference"
    }
    assert users <= ORACLE_USERS, users - ORACLE_USERS


# (spelt in two parts, so that this file holds no occurrence of its own)
SEARCH_PATH = "sys." + "path"


def test_no_module_search_path_edit_anywhere():
    edits = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in ("docs", ".venv", ".git", "build") or "site-packages" in rel.parts:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if SEARCH_PATH in line:
                edits.append(f"{rel}:{number}: {line.strip()}")
    assert edits == []


def _python(code: str, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, *args, "-c", textwrap.dedent(code)] if code else [sys.executable, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=600,
    )


def test_import_from_another_folder_needs_no_dsl(tmp_path):
    """Installed (``pip install -e .`` in run_tests.sh), the package imports from any folder, and
    importing it loads neither the CuTe DSL nor the oracle."""
    r = _python(
        """
        import sys
        import fp4_ops
        assert "cutlass" not in sys.modules and "reference" not in sys.modules, sorted(sys.modules)
        print(fp4_ops.__file__)
        """,
        tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()).parent == PACKAGE


def test_wheel_installs_only_the_projects_names(tmp_path):
    """The wheel holds the package and the two template modules, nothing named reference,
    hopper, tools, tests or benchmarks."""
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    (wheel,) = tmp_path.glob("*.whl")
    with zipfile.ZipFile(wheel) as z:
        top = {name.split("/")[0] for name in z.namelist()}
        files = set(z.namelist())
    assert {t for t in top if not t.endswith(".dist-info")} == {
        "fp4_ops",
        TEMPLATE.name,
        GROUPED_TEMPLATE.name,
    }
    for module in _library_modules().values():
        assert str(module.relative_to(ROOT)) in files
    # (the GPU stack is Linux-only: elsewhere the CPU path installs and runs without it)
    with zipfile.ZipFile(wheel) as z:
        (metadata,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        requires = [
            line.split(":", 1)[1].strip()
            for line in z.read(metadata).decode().splitlines()
            if line.startswith("Requires-Dist:") and "extra ==" not in line
        ]
    gpu = [r for r in requires if r.startswith(GPU_STACK)]
    assert len(gpu) == len(GPU_STACK), requires
    assert all(r.endswith('; sys_platform == "linux"') for r in gpu), gpu
    assert all("sys_platform" not in r for r in set(requires) - set(gpu)), requires


#: the GPU kernels' distributions and the modules they install
GPU_STACK = ("nvidia-cutlass-dsl", "cuda-bindings", "apache-tvm-ffi")
GPU_MODULES = ("cutlass", "cuda", "tvm_ffi")

#: CPU work through the public API: quantize, both GEMMs, FP4Linear, quantize_model, fp4_moe;
#: prints a digest of every result
CPU_WORK = """
    import hashlib, torch, fp4_ops
    torch.manual_seed(0)
    x, w = torch.randn(4, 64), torch.randn(32, 64)
    qx, qw = fp4_ops.quantize(x), fp4_ops.quantize(w)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32))
    fp4_ops.quantize_model(model)
    w13 = fp4_ops.quantize_experts(torch.randn(4, 64, 64))
    w2 = fp4_ops.quantize_experts(torch.randn(4, 64, 32))
    ids = torch.tensor([[0, 3], [1, 2], [2, 0], [3, 1]])
    outs = [
        qx.dequantize(),
        fp4_ops.fp4_gemm(qx, qw),
        fp4_ops.fp4_gemm(x.bfloat16(), qw),
        fp4_ops.FP4Linear.from_linear(torch.nn.Linear(64, 32), activations="bf16")(x.bfloat16()),
        model(x),
        fp4_ops.fp4_moe(x.bfloat16(), w13, w2, torch.full((4, 2), 0.5), ids),
    ]
    digest = hashlib.sha256()
    for out in outs:
        digest.update(out.float().contiguous().numpy().tobytes())
    print(digest.hexdigest())
"""


def test_cpu_path_runs_without_the_kernel_stack(tmp_path):
    """Where the GPU stack is not installed (any system but Linux), the CPU path imports and
    runs, and gives the results it gives beside the stack."""
    blocked = f"""
        import importlib.abc, sys

        class NotInstalled(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name.partition(".")[0] in {GPU_MODULES!r}:
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)

        sys.meta_path.insert(0, NotInstalled())
    """
    without = _python(textwrap.dedent(blocked) + textwrap.dedent(CPU_WORK), tmp_path)
    assert without.returncode == 0, without.stderr
    beside = _python(CPU_WORK, tmp_path)
    assert beside.returncode == 0, beside.stderr
    assert without.stdout == beside.stdout and len(without.stdout.strip()) == 64


def test_template_runs_copied_alone(tmp_path):
    """blockwise_gemm_fp4.py copied alone into an empty folder: it imports (without the package
    or the oracle), prepare_gemm builds its launch (CUDA-only steps replaced: no GPU here), the
    GPU run's need for reference.py is a clear error, and --compile_only works."""
    (tmp_path / TEMPLATE.name).write_text(TEMPLATE.read_text())
    r = _python(
        """
        import contextlib, os, sys
        from types import SimpleNamespace
        import torch
        import blockwise_gemm_fp4 as bw

        assert os.path.dirname(bw.__file__) == os.getcwd(), bw.__file__
        bw._check_cuda_operands = lambda **_: None
        bw._compiled_kernel = lambda *_: "kernel"
        torch.cuda.current_stream = lambda *_: SimpleNamespace(cuda_stream=7)
        torch.cuda.device = lambda *_: contextlib.nullcontext()
        a = torch.zeros(1, 256, 256, dtype=torch.uint8)
        b = torch.zeros(1, 128, 256, dtype=torch.uint8)
        sfa = torch.zeros(1, 256 * 32, dtype=torch.float8_e4m3fn)
        sfb = torch.zeros(1, 128 * 32, dtype=torch.float8_e4m3fn)
        launch, d = bw.prepare_gemm(a, b, sfa, sfb, 16, alpha=0.5)
        assert isinstance(launch, bw.PreparedGemm) and d.shape == (1, 256, 128)
        try:
            bw.reference_beside_this_file()
        except bw.UsageError as err:
            print("usage error:", err)
        assert "fp4_ops" not in sys.modules and "reference" not in sys.modules
        """,
        tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert "usage error:" in r.stdout and "reference.py" in r.stdout
    dump = tmp_path / "dump"
    r = _python(
        "",
        tmp_path,
        TEMPLATE.name,
        "--mnkl",
        "256,128,256,1",
        "--compile_only",
        "--dump_dir",
        str(dump),
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "cubin:" in r.stdout and list(dump.rglob("*.cubin"))


def test_grouped_template_runs_copied_with_its_dense_sibling(tmp_path):
    """blockwise_grouped_gemm_fp4.py and the template it extends, copied alone into an empty
    folder: the grouped one imports the dense one from there (not the package, not the oracle)
    and --compile_only writes its cubin."""
    for path in (TEMPLATE, GROUPED_TEMPLATE):
        (tmp_path / path.name).write_text(path.read_text())
    r = _python(
        """
        import os, sys
        import blockwise_grouped_gemm_fp4 as grouped
        assert os.path.dirname(grouped.bw.__file__) == os.getcwd(), grouped.bw.__file__
        assert "fp4_ops" not in sys.modules and "reference" not in sys.modules
        """,
        tmp_path,
    )
    assert r.returncode == 0, r.stderr
    dump = tmp_path / "dump"
    dump.mkdir()
    args = ["--group_rows", "8,0,300", "--nk", "256,256", "--compile_only", "--dump_dir", str(dump)]
    r = _python("", tmp_path, GROUPED_TEMPLATE.name, *args)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Compiled for sm_100f" in r.stdout and list(dump.rglob("*.cubin"))


def test_readme_python_snippet_runs_from_another_folder(tmp_path):
    """The README's first Python example, as a new user runs it: installed package, CPU tensors,
    a folder outside the checkout."""
    text = (ROOT / "README.md").read_text()
    snippet = text.split("## Python API", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    r = _python(snippet + "\nprint(tuple(y.shape), tuple(y16.shape), y.dtype)\n", tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "(16, 1024) (16, 1024) torch.bfloat16"


def test_readme_blackwell_snippet_shapes_reach_the_launcher():
    """The README's Blackwell example hands gemm FP4Tensor parts as it writes them: the shapes
    pass the launcher's operand checks (on CPU tensors; the launch itself needs a B200)."""
    import torch

    import blockwise_gemm_fp4 as bw
    import fp4_ops

    text = (ROOT / "README.md").read_text()
    assert "bw.gemm(a.data[None], b.data[None], a.scale.reshape(1, -1), b.scale.reshape(1, -1)" in (
        text
    )
    a, b = fp4_ops.quantize(torch.randn(16, 4096)), fp4_ops.quantize(torch.randn(1024, 4096))
    mnkl = bw._problem(
        a.data[None], b.data[None], a.scale.reshape(1, -1), b.scale.reshape(1, -1), 16
    )
    assert mnkl == (16, 1024, 4096, 1)
