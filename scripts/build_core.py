#!/usr/bin/env python3
"""Compile the admission core (jupyter_gpuaas/admission/*.py) with mypyc, in place,
together with the simulator's replay loop, report and parser (jupyter_gpuaas/sim/driver.py,
report.py, scenario.py), which a month's trace spends the rest of its time in.

    .venv/bin/python scripts/build_core.py [--clean] [--force]

The pure-Python source stays the reference: mypyc turns the same typed modules into C
extensions, which Python imports instead of the .py files when both sit side by side.
The package is installed editable (`pip install -e .`), so the extensions are written
next to the sources: jupyter_gpuaas/admission/NAME.<EXT_SUFFIX>, one small module per
source plus one shared library holding all the compiled code (`_compiled__mypyc`).
Intermediate files (C sources, objects, mypy's cache, the build log) go to build/mypyc.
`make core` runs this; `make pytest`, `demo`, `scenarios` and `bench` depend on it, and
tests/conftest.py reruns it when a source changed since its compiled module was built.
A wheel build runs the same `ensure()` through hatch_build.py (a platform wheel with the
compiled modules, or a pure one with a warning). A compile takes a minute or two: a
line every 15 s on stderr says how far it is.

Compiling is an optimisation, never a requirement. With GPUAAS_PURE=1 in the environment,
without mypyc, setuptools, a C compiler or the Python headers, or when mypyc fails (a type
error while an edit is under way, say), any compiled module left over is removed, one line
on stderr says the core runs as pure Python, and the exit status is 0: the product works
the same, only slower. `--clean` removes the compiled modules (pure mode until the next
build). Nothing is done when the compiled modules were built from the sources and this
script as they are now (a hash of their contents, kept in build/mypyc/sources.sha256: an
edit is noticed even when a copy or an archive gives a file an older mtime): a no-op run
costs one interpreter start.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = Path(__file__).resolve()
PACKAGE = "jupyter_gpuaas.admission"
SOURCE_DIR = REPO / "jupyter_gpuaas" / "admission"
SIM_DIR = REPO / "jupyter_gpuaas" / "sim"
# The simulator's modules a month's replay spends its time in: the replay loop, the
# report, and the trace parser (a CSV of 100,000 rows).
SIM_MODULES = ("driver", "report", "scenario")
BUILD_DIR = REPO / "build" / "mypyc"
LOG = BUILD_DIR / "build.log"
FINGERPRINT = BUILD_DIR / "sources.sha256"
# mypyc puts the code of all the modules compiled together in one shared library; naming
# the group keeps that library inside the package (by default it lands, hash-named, in
# the repository root).
GROUP = f"{PACKAGE}._compiled"
EXT_SUFFIX: str = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
# Anything like an extension module in the admission folder is ours: any Python
# version's suffix (a venv rebuilt on another Python leaves its old ones behind).
COMPILED_GLOBS = ("*.so", "*.pyd")
# Seconds between the progress lines of a compile.
PROGRESS_EVERY = 15.0


def sources() -> list[Path]:
    """Every module of the admission package but `__init__.py` (kept pure: it is empty),
    and the simulator's hot modules."""
    core = sorted(p for p in SOURCE_DIR.glob("*.py") if p.name != "__init__.py")
    return core + [SIM_DIR / f"{name}.py" for name in SIM_MODULES]


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts)


def expected_outputs() -> list[Path]:
    shared = SOURCE_DIR / (GROUP.rsplit(".", 1)[1] + "__mypyc" + EXT_SUFFIX)
    return [p.with_name(p.stem + EXT_SUFFIX) for p in sources()] + [shared]


def compiled_files() -> list[Path]:
    """The compiled modules present in the admission and sim folders now."""
    found = [p for pattern in COMPILED_GLOBS for p in SOURCE_DIR.glob(pattern)]
    for name in SIM_MODULES:
        found += [p for pattern in COMPILED_GLOBS for p in SIM_DIR.glob(f"{name}.{pattern}")]
    return sorted(found)


def fingerprint() -> str:
    """A hash of what the compiled modules are built from: the sources and this script."""
    digest = hashlib.sha256(EXT_SUFFIX.encode())
    for path in [*sources(), SCRIPT]:
        digest.update(f"\0{path.name}\0".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def is_stale() -> bool:
    """True when the compiled modules present do not match the sources.

    No compiled module at all is pure mode, not staleness. Otherwise the set must be
    complete (a new source, or a left-over module of a deleted one, is stale) and built
    from the sources as they are now (the same fingerprint).
    """
    present = compiled_files()
    if not present:
        return False
    if set(present) != set(expected_outputs()):
        return True
    try:
        built_from = FINGERPRINT.read_text(encoding="ascii").strip()
    except OSError:
        return True
    return built_from != fingerprint()


def remove_compiled() -> None:
    # unlink, never truncate: a process that has an old module loaded keeps its copy.
    for path in compiled_files():
        path.unlink(missing_ok=True)
    FINGERPRINT.unlink(missing_ok=True)


def pure(reason: str) -> str:
    """Pure mode: no compiled module is left; returns the reason (also on stderr)."""
    remove_compiled()
    print(
        f"build_core: {reason}: the admission core runs as pure Python (slower, same decisions)",
        file=sys.stderr,
    )
    return reason


def missing_toolchain() -> str | None:
    """Why mypyc cannot build here, or None."""
    import importlib.util

    for module in ("mypyc", "setuptools"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (pip install -e '.[test]')"
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    compiler = shlex.split(cc)[0] if cc.strip() else "cc"
    if shutil.which(compiler) is None:
        return f"no C compiler ({compiler} not found)"
    include = sysconfig.get_paths().get("include", "")
    if not (Path(include) / "Python.h").is_file():
        return f"no Python headers (Python.h not in {include})"
    return None


@contextlib.contextmanager
def locked() -> Iterator[None]:
    """One build at a time (`make` and a pytest session may start one together)."""
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # Windows: no lock
        yield
        return
    with open(BUILD_DIR / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def first_error(log: Path) -> str:
    try:
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    for line in lines:
        if "error:" in line or "Error" in line:
            return line.strip()[:200]
    return ""


def phase(log: Path) -> str:
    """What the compile is doing now, read from its log: mypy and mypyc first (no output
    until the C code is written), then setuptools' "building" and one compiler line."""
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "starting"
    if "copying " in text:
        return "compiled, copying the modules in place"
    built = text.count("building '")
    if built == 1:  # the shared library that holds all the code: most of the time
        return "C compiler: the shared library with all the compiled code (the longest step)"
    if built:
        return f"C compiler: module {built - 1} of {len(sources())}"
    return "mypy type-checks and mypyc writes C (no output until the C compiler starts)"


def build() -> str | None:
    """Compile in a child process, its output (mypy's, gcc's) to build/mypyc/build.log.
    None when the compiled modules are built and import; else why the core stays pure."""
    started = time.time()
    # Taken before mypyc reads the sources: one edited during the build makes the next
    # run rebuild.
    built_from = fingerprint()
    remove_compiled()
    command = [sys.executable, str(SCRIPT), "--setup"]
    rel = LOG.relative_to(REPO)
    print(
        f"build_core: compiling the admission core and the simulator ({len(sources())} modules) "
        f"with mypyc; this takes a minute or two (log: {rel})",
        file=sys.stderr,
        flush=True,
    )
    with open(LOG, "w", encoding="utf-8") as log:
        child = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        while True:
            try:
                returncode = child.wait(timeout=PROGRESS_EVERY)
                break
            except subprocess.TimeoutExpired:
                print(
                    f"build_core: {time.time() - started:.0f} s: {phase(LOG)}",
                    file=sys.stderr,
                    flush=True,
                )
    if returncode != 0:
        detail = first_error(LOG) or f"exit status {returncode}"
        return pure(f"mypyc failed ({detail}; see {rel})")
    missing = [p for p in expected_outputs() if not p.exists()]
    if missing:
        return pure(f"mypyc did not write {missing[0].name} (see {rel})")
    # Import what was built in a fresh interpreter, the way the product will.
    check = (
        "import importlib, sys\n"
        "for name in sys.argv[1:]:\n"
        "    m = importlib.import_module(name)\n"
        "    assert not m.__file__.endswith('.py'), m.__file__\n"
    )
    modules = [module_name(p) for p in sources()]
    search = [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(search)}
    imported = subprocess.run(
        [sys.executable, "-c", check, *modules], cwd=REPO, env=env, capture_output=True, text=True
    )
    if imported.returncode != 0:
        last = (imported.stderr.strip().splitlines() or ["?"])[-1][:200]
        return pure(f"the compiled core does not import ({last})")
    FINGERPRINT.write_text(built_from + "\n", encoding="ascii")
    print(
        f"build_core: compiled {len(modules)} modules (admission core, simulator) with mypyc "
        f"in {time.time() - started:.1f} s",
        file=sys.stderr,
    )
    return None


def setup() -> None:
    """The child: mypycify + setuptools' build_ext --inplace (what the `mypyc` CLI runs)."""
    import inspect

    from mypyc.build import mypycify
    from setuptools import setup as setuptools_setup  # type: ignore[import-untyped]

    if "group_name" not in inspect.signature(mypycify).parameters:
        raise SystemExit("error: this mypy's mypyc has no group_name (pip install -U mypy)")

    paths = [str(p.relative_to(REPO)) for p in sources()]
    # mypy options for the compile: pyproject.toml's [tool.mypy] (strict) applies; imports
    # outside the compiled modules are skipped, so a type error elsewhere in the project
    # (jupyter_gpuaas/__init__.py lazily imports the server) cannot block the core.
    options = [f"--cache-dir={BUILD_DIR / 'mypy_cache'}", "--follow-imports=skip"]
    extensions = mypycify(
        paths + options,
        target_dir=str(BUILD_DIR.relative_to(REPO)),
        group_name=GROUP,
        opt_level="3",
    )
    setuptools_setup(
        name="jupyter-gpuaas-core",
        # No package discovery (the repository root holds several top-level folders).
        packages=[],
        py_modules=[],
        ext_modules=extensions,
        script_args=[
            "build_ext",
            "--inplace",
            f"--build-temp={BUILD_DIR / 'temp'}",
            f"--build-lib={BUILD_DIR / 'lib'}",
        ],
    )


def ensure(force: bool = False) -> str | None:
    """Compiled modules built from the sources as they are now, built if need be: None,
    or the reason the core runs as pure Python (no compiled module is then left)."""
    if os.environ.get("GPUAAS_PURE", "") not in ("", "0"):
        return pure("GPUAAS_PURE is set")
    if not force and compiled_files() and not is_stale():
        return None
    reason = missing_toolchain()
    if reason:
        return pure(reason)
    with locked():
        # Another process may have built it while this one waited.
        if not force and compiled_files() and not is_stale():
            return None
        return build()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clean", action="store_true", help="remove the compiled modules")
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    parser.add_argument("--setup", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.setup:
        setup()
    elif args.clean:
        pure("--clean")
    else:
        ensure(force=args.force)
    return 0  # pure Python is a slower product, not a failed build


if __name__ == "__main__":
    raise SystemExit(main())
