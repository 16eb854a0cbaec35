"""The house as a newcomer sees it from a shell: light commands stay light.

Run in a fresh interpreter each, so what another test imported does not count.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest


def _imported_after(code: str) -> set[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUAAS_", "JUPYTERHUB_"))}
    probe = code + "\nimport sys\nprint(' '.join(sorted(sys.modules)))\n"
    out = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    )
    return set(out.stdout.splitlines()[-1].split())


def test_the_package_face_imports_neither_server_nor_notebook() -> None:
    mods = _imported_after("import jupyter_gpuaas")
    assert "jupyter_gpuaas._version" in mods
    above = ("jupyter_gpuaas.server", "jupyter_gpuaas.notebook")
    assert not {m for m in mods if m.startswith(above)}
    assert "jupyter_server" not in mods and "IPython" not in mods


@pytest.mark.parametrize("argv", [["jobs", "--help"], ["jobs"], ["logs", "some-id"]])
def test_a_jobs_command_in_a_shell_never_imports_ipywidgets(argv: list[str]) -> None:
    # `jobs` without a server to talk to ends in one line and exit 1; the views it would
    # print are imported on the way (jobs/views.py), the widgets never.
    mods = _imported_after(
        "from jupyter_gpuaas.cli import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
    )
    assert "jupyter_gpuaas.jobs.cli" in mods
    assert "ipywidgets" not in mods and "IPython" not in mods
    assert not {m for m in mods if m.startswith("jupyter_gpuaas.notebook")}


def test_simulate_pays_for_no_service_at_start_up() -> None:
    # Every command registers every subcommand first: the gateway's Application (traitlets,
    # ssl, asyncio) is imported only when `gateway` runs.
    mods = _imported_after(
        "from jupyter_gpuaas.cli import main\n"
        "try:\n    main(['simulate', '--help'])\nexcept SystemExit:\n    pass\n"
    )
    assert "jupyter_gpuaas.sim.cli" in mods
    heavy = ("asyncio", "ssl", "traitlets", "tornado", "jupyter_gpuaas.gateway.app")
    assert not {m for m in mods if m.split(".")[0] in heavy or m in heavy}


@pytest.mark.slow
def test_the_magics_still_load_by_the_package_name() -> None:
    mods = _imported_after(
        "from IPython.testing.globalipapp import start_ipython\n"
        "ip = start_ipython()\n"
        "ip.run_line_magic('load_ext', 'jupyter_gpuaas')\n"
        "assert 'gpu' in ip.magics_manager.magics['line']\n"
        "assert 'gpu_job' in ip.magics_manager.magics['cell']\n"
    )
    assert "jupyter_gpuaas.notebook.magics" in mods


PACKAGE = Path(__file__).resolve().parent.parent / "jupyter_gpuaas"
ADMISSION = PACKAGE / "admission"

# What the pure core may import of the standard library: data structures and arithmetic,
# nothing that reads a clock, a file, the network, the environment or chance. (The
# import-linter contract names the I/O modules it forbids; this names what it allows, so a
# new import of `os` or `random` fails here even before anyone lists it there.)
# zlib for its crc32 only: a hash of a string that is the same in every process (Python's
# own `hash` of a str is salted per process), computed, with no I/O.
PURE_STDLIB = {
    "__future__", "bisect", "collections", "dataclasses", "enum", "functools", "heapq",
    "itertools", "math", "operator", "typing", "zlib",
}  # fmt: skip


def _parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


@pytest.mark.slow
def test_every_module_says_what_it_is() -> None:
    """A module holds one concept, however long: its docstring names it."""
    missing = [
        str(p.relative_to(PACKAGE))
        for p in sorted(PACKAGE.rglob("*.py"))
        if p.read_text().strip() and ast.get_docstring(_parsed(p)) is None
    ]
    assert missing == []


def test_the_admission_core_imports_only_itself_and_pure_stdlib() -> None:
    outside: list[str] = []
    for p in sorted(ADMISSION.glob("*.py")):
        for node in ast.walk(_parsed(p)):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level == 1:
                    continue  # a sibling in admission/
                names = ["." * node.level + (node.module or "")]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in PURE_STDLIB and not name.startswith("jupyter_gpuaas.admission."):
                    outside.append(f"{p.name}: {name}")
    assert outside == []


def test_the_admission_core_is_composed_not_stacked() -> None:
    """No class of admission/ is built on another of admission/ (issue 41: the core holds
    its collaborators as fields, as Kueue's Scheduler does, not as a chain of mixins)."""
    trees = {p.stem: _parsed(p) for p in sorted(ADMISSION.glob("*.py"))}
    ours = {n.name for t in trees.values() for n in ast.walk(t) if isinstance(n, ast.ClassDef)}
    assert _built_on(trees, ours) == []


def _built_on(trees: dict[str, ast.Module], ours: set[str]) -> list[str]:
    """`module.Class(Base)` for each class of `trees` whose base is one named in `ours`."""
    return [
        f"{mod}.{n.name}({ast.unparse(b)})"
        for mod, t in trees.items()
        for n in ast.walk(t)
        if isinstance(n, ast.ClassDef)
        for b in n.bases
        if ast.unparse(b).split(".")[-1] in ours
    ]


GATEWAY = PACKAGE / "gateway"
# The gateway's driver: the arbiter (memory) and the collaborators it holds as fields.
DRIVER = ("arbiter", "group_commit", "store_calls", "stalls", "views")


@pytest.mark.slow
def test_the_gateways_driver_is_composed_not_mixed() -> None:
    """The arbiter holds its group commit, store calls and stalls as fields and calls the
    views, functions of the core's state (issue 41): none of the driver's classes is
    built on another class of the package, and the group commit is one object."""
    package = [_parsed(p) for p in sorted(PACKAGE.rglob("*.py"))]
    ours = {n.name for t in package for n in ast.walk(t) if isinstance(n, ast.ClassDef)}
    trees = {mod: _parsed(GATEWAY / f"{mod}.py") for mod in DRIVER}
    assert _built_on(trees, ours) == []
    init = next(
        n
        for n in ast.walk(trees["arbiter"])
        if isinstance(n, ast.FunctionDef) and n.name == "__init__"
    )
    fields = {
        ast.unparse(a.targets[0]): ast.unparse(a.value.func)
        for a in ast.walk(init)
        if isinstance(a, ast.Assign) and isinstance(a.value, ast.Call)
    }
    assert fields.get("self.group") == "GroupCommit"


def test_every_floor_has_its_modules_layered() -> None:
    """import-linter: one `layers` contract per floor (package) over its own modules,
    exhaustive, so no floor is a bag whose modules import one another freely; and no
    line of any layers contract lets its parts import each other (`:`)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    config = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    layered = {
        c["containers"][0]
        for c in contracts
        if c["type"] == "layers" and len(c.get("containers", [])) == 1 and c.get("exhaustive")
    }
    floors = {f"jupyter_gpuaas.{p.parent.name}" for p in PACKAGE.glob("*/__init__.py")}
    assert floors - layered == set()
    free = [line for c in contracts if c["type"] == "layers" for line in c["layers"] if ":" in line]
    assert free == []


LOADERS = {"import_item", "import_module", "__import__"}


def _calls(tree: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            names.add(f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", ""))
    return names


@pytest.mark.slow
def test_no_module_loads_a_class_of_the_package_by_name() -> None:
    """import-linter sees every arrow: a module that loads classes by a dotted name (a
    deployment's config may name one) never names one of the package's own in a string
    (`import_item("jupyter_gpuaas.x.y.Class")`, a trait's default), which would hide an
    import that may point up (issue 41: the gateway reached kubernetes/ so)."""
    dotted = re.compile(r"jupyter_gpuaas(\.\w+)+\.[A-Z]\w*")
    found = []
    for p in sorted(PACKAGE.rglob("*.py")):
        tree = _parsed(p)
        if not _calls(tree) & LOADERS:
            continue
        found += [
            f"{p.relative_to(PACKAGE)}:{node.lineno}: {node.value}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and dotted.fullmatch(node.value)
        ]
    assert found == []
