"""The compiled admission core decides exactly as its pure-Python source.

`make core` (scripts/build_core.py) compiles jupyter_gpuaas/admission/*.py with mypyc, in
place; the .py files stay the reference. Every conformance scenario and three generated
benchmark traces are replayed twice: through the compiled modules, in this process (the
normal import), and through the pure source, in one subprocess whose path starts with a
copy of the package that holds no compiled module. The decision streams (the lines
`simulate --events FILE` writes) must be identical, byte for byte.

Skipped when the core is not compiled (no C compiler, GPUAAS_PURE=1, `build_core.py
--clean`): there is then only one implementation.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import jupyter_gpuaas
import jupyter_gpuaas.admission.core as admission_core

HERE = Path(__file__).resolve().parent
BENCHMARKS = HERE.parent / "benchmarks"
SCENARIOS = {p.stem: p for p in sorted((HERE / "scenarios").glob("*.yaml"))}
# Generated traces, small enough to replay twice in a few seconds: Kueue's baseline at
# full size (preemption, borrowing, reclaim) and the month trace (culls, reservations,
# expiry, rejections, cancels, fair sharing), once with kernels and servers preemptible,
# and once more so with a preemption grace (warnings, withdrawals, kept room).
GENERATED = (
    "kueue-baseline",
    "month-20000",
    "month-5000-preempt-interactive",
    "month-20000-preempt-interactive-grace",
)
PACKAGE_DIR = Path(jupyter_gpuaas.__file__).resolve().parent
COMPILED_MODULES = [
    f"admission.{p.stem}"
    for p in sorted((PACKAGE_DIR / "admission").glob("*.py"))
    if p.name != "__init__.py"
] + ["sim.driver", "sim.report", "sim.scenario"]
COMPILED = not admission_core.__file__.endswith(".py")

pytestmark = [
    pytest.mark.skipif(
        not COMPILED,
        reason="the admission core runs as pure Python here (not compiled: no C compiler, "
        "GPUAAS_PURE=1 or `scripts/build_core.py --clean`): nothing to compare",
    ),
    # Every scenario and four generated traces, each replayed by a pure-Python subprocess
    # too: about 20 s, a third of the fast part's minute.
    pytest.mark.slow,
]


def decision_stream(path: str) -> str:
    """What `jupyter-gpuaas simulate PATH --events FILE` writes to FILE.

    Runs in this process (compiled core) and in the pure subprocess alike. A replay that
    raises yields the exception's class instead: both sides must then raise the same.
    """
    from jupyter_gpuaas.sim.driver import run_scenario
    from jupyter_gpuaas.sim.report import Tally
    from jupyter_gpuaas.sim.scenario import load_scenario

    scenario = load_scenario(path)
    out = io.StringIO()
    tally = Tally(scenario, out)
    try:
        run_scenario(scenario, tally=tally)
    except Exception as exc:
        return f"raised {type(exc).__name__}\n"
    tally.flush()
    return out.getvalue()


# The pure side: load this file by path (its `decision_stream`), check that the core came
# from the pure copy, then write one stream per scenario. argv: copy, this file, then
# (scenario, output) pairs.
PURE_RUNNER = """\
import importlib.util, sys
from pathlib import Path
import jupyter_gpuaas.admission.core as core
root = Path(sys.argv[1]).resolve()
where = Path(core.__file__).resolve()
if where.suffix != ".py" or root not in where.parents:
    raise SystemExit(f"the pure run imported the core from {where}, not from {root}")
import jupyter_gpuaas.sim.driver as driver
if not driver.__file__.endswith(".py"):
    raise SystemExit(f"the pure run imported the driver from {driver.__file__}")
spec = importlib.util.spec_from_file_location("_compiled_core_test", sys.argv[2])
test = importlib.util.module_from_spec(spec)
spec.loader.exec_module(test)
pairs = sys.argv[3:]
for scenario, output in zip(pairs[::2], pairs[1::2]):
    Path(output).write_text(test.decision_stream(scenario), encoding="utf-8")
print(where)
"""


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("generated")
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(BENCHMARKS))
        import kueue_baseline
        import month_trace

        paths = {}
        for name, make in (
            ("kueue-baseline", lambda d: kueue_baseline.generate(d)),
            ("month-20000", lambda d: month_trace.generate(d, requests=20000)),
            (
                "month-5000-preempt-interactive",
                lambda d: month_trace.generate(d, 5000, seed=11, preempt_interactive=True),
            ),
            (
                "month-20000-preempt-interactive-grace",
                lambda d: _with_grace(
                    month_trace.generate(d, 20000, seed=11, preempt_interactive=True), 600
                ),
            ),
        ):
            folder = out / name
            folder.mkdir()
            paths[name] = make(folder)
    assert set(paths) == set(GENERATED)
    return paths


def _with_grace(path: Path, seconds: float) -> Path:
    """The generated scenario with `policy.preemption_grace` set."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    doc.setdefault("policy", {})["preemption_grace"] = seconds
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def pure_streams(
    tmp_path_factory: pytest.TempPathFactory, generated: dict[str, Path]
) -> dict[str, str]:
    """Every scenario's decision stream from the pure-Python source (one subprocess)."""
    root = tmp_path_factory.mktemp("pure")
    shutil.copytree(
        PACKAGE_DIR,
        root / "jupyter_gpuaas",
        ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__"),
    )
    assert not list((root / "jupyter_gpuaas").rglob("*.so"))
    scenarios = {**SCENARIOS, **generated}
    args: list[str] = []
    for name, path in scenarios.items():
        args += [str(path), str(root / f"{name}.events")]
    # The copy alone on PYTHONPATH, ahead of the editable install's path entry; cwd is the
    # copy too (`python -c` puts the cwd first on sys.path), and no bytecode is written
    # into it.
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", PURE_RUNNER, str(root), __file__, *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.strip() == str((root / "jupyter_gpuaas/admission/core.py").resolve())
    return {name: (root / f"{name}.events").read_text(encoding="utf-8") for name in scenarios}


def test_the_whole_core_is_compiled() -> None:
    """A partial build would compare a mix: every admission module but `__init__`, and
    the simulator's driver, report and parser, are compiled."""
    import importlib

    pure = []
    for name in COMPILED_MODULES:
        module = importlib.import_module(f"jupyter_gpuaas.{name}")
        if str(module.__file__).endswith(".py"):
            pure.append(name)
    assert not pure, f"not compiled: {pure} (rerun scripts/build_core.py)"


def _assert_same(name: str, compiled: str, pure: str) -> None:
    if compiled == pure:
        return
    a, b = compiled.splitlines(), pure.splitlines()
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            pytest.fail(f"{name}: decision {i + 1} differs\n compiled: {x}\n     pure: {y}")
    pytest.fail(f"{name}: {len(a)} decisions compiled, {len(b)} pure; the rest agree")


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenario_same_decisions(name: str, pure_streams: dict[str, str]) -> None:
    _assert_same(name, decision_stream(str(SCENARIOS[name])), pure_streams[name])


@pytest.mark.parametrize("name", GENERATED)
def test_generated_trace_same_decisions(
    name: str, generated: dict[str, Path], pure_streams: dict[str, str]
) -> None:
    _assert_same(name, decision_stream(str(generated[name])), pure_streams[name])
