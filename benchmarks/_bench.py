"""Helpers shared by the benchmark scripts: run the CLI, measure it, describe the machine.

Every benchmark that times `jupyter-gpuaas simulate` times the WHOLE process (interpreter
start, imports, parsing, simulation, report, JSON on stdout) from the outside, as a user
would experience it. Peak memory is the child's own max RSS, read with `os.wait4` so that
each run is measured alone (RUSAGE_CHILDREN would report the maximum over all children).
"""

from __future__ import annotations

import json
import math
import os
import platform
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
GENERATED = BENCH_DIR / "generated"


def cli_path() -> str:
    """The `jupyter-gpuaas` console script next to the running interpreter (the venv's)."""
    here = Path(sys.executable).parent / "jupyter-gpuaas"
    if here.exists():
        return str(here)
    found = shutil.which("jupyter-gpuaas")
    if found is None:
        raise SystemExit("jupyter-gpuaas not found: run `make setup` (or pip install -e .)")
    return found


def rel(path: str | Path) -> str:
    """A path relative to the repository root when it is inside it (for printed commands)."""
    p = Path(path).resolve()
    try:
        return str(p.relative_to(REPO))
    except ValueError:
        return str(p)


@dataclass
class Run:
    wall: float  # seconds, whole process
    max_rss_mib: float  # the child's peak resident memory
    returncode: int
    stdout: str
    timed_out: bool = False
    cpu: float = 0.0  # user + system CPU seconds of the child


@dataclass
class Timing:
    command: list[str]
    runs: list[Run] = field(default_factory=list)

    @property
    def best(self) -> float:
        return min(r.wall for r in self.runs)

    @property
    def median(self) -> float:
        return statistics.median(r.wall for r in self.runs)

    @property
    def max_rss_mib(self) -> float:
        return max(r.max_rss_mib for r in self.runs)

    @property
    def best_cpu(self) -> float:
        return min(r.cpu for r in self.runs)

    @property
    def timed_out(self) -> bool:
        return any(r.timed_out for r in self.runs)

    def as_dict(self) -> dict[str, Any]:
        return {
            "command": " ".join(self.command),
            "timed_out": self.timed_out,
            "walls": [round(r.wall, 3) for r in self.runs],
            "best_s": round(self.best, 3),
            "median_s": round(self.median, 3),
            "cpu_s": [round(r.cpu, 3) for r in self.runs],
            "best_cpu_s": round(self.best_cpu, 3),
            "max_rss_mib": round(self.max_rss_mib, 1),
        }


def run_measured(
    command: Sequence[str],
    cwd: str | Path | None = None,
    timeout: float | None = None,
    env: dict[str, str] | None = None,
) -> Run:
    """Run `command` to completion; wall time and peak RSS of that child alone.

    Past `timeout` seconds the child is killed and the run marked `timed_out`.
    """
    with (
        tempfile.TemporaryFile("w+", encoding="utf-8") as out,
        tempfile.TemporaryFile("w+b") as errf,
    ):
        started = time.perf_counter()
        proc = subprocess.Popen(list(command), stdout=out, stderr=errf, cwd=cwd, env=env)
        killer = threading.Timer(timeout, proc.kill) if timeout else None
        if killer is not None:
            killer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            if killer is not None:
                killer.cancel()
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        errf.seek(0)
        err = errf.read().decode("utf-8", "replace")
        out.seek(0)
        text = out.read()
    rss = usage.ru_maxrss / (1024 * 1024 if sys.platform == "darwin" else 1024)
    cpu = usage.ru_utime + usage.ru_stime
    if timeout and proc.returncode == -signal.SIGKILL and wall >= timeout:
        return Run(wall, rss, proc.returncode, "", timed_out=True, cpu=cpu)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {proc.returncode}:\n{err.strip()}")
    return Run(wall, rss, proc.returncode, text, cpu=cpu)


def time_simulate(
    scenario: str | Path,
    repeat: int = 3,
    stop_over: float | None = None,
    timeout: float | None = None,
    env: dict[str, str] | None = None,
) -> tuple[Timing, dict[str, Any]]:
    """`jupyter-gpuaas simulate SCENARIO --json`, `repeat` times; the timing and one result.

    A run slower than `stop_over` seconds is not repeated (it has missed its target by
    far; repeating only costs time); one past `timeout` is killed and ends the series.
    `env`: the child's environment (`pure_env`: the core as pure Python).
    """
    command = [cli_path(), "simulate", str(scenario), "--json"]
    timing = Timing(command)
    result: dict[str, Any] = {}
    for _ in range(repeat):
        run = run_measured(command, timeout=timeout, env=env)
        timing.runs.append(run)
        if run.timed_out:
            break
        if not result:
            result = json.loads(run.stdout)
        if stop_over is not None and run.wall > stop_over:
            break
    return timing, result


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile, as the simulator's report computes it."""
    s = sorted(values)
    if not s:
        return 0.0
    rank = max(1, math.ceil(p / 100.0 * len(s)))
    return float(s[min(rank, len(s)) - 1])


def out_dir(arg: str | None) -> Path:
    """Where generated inputs go: the given folder, else benchmarks/generated/."""
    path = Path(arg) if arg else GENERATED
    path.mkdir(parents=True, exist_ok=True)
    return path


def machine() -> dict[str, Any]:
    """CPU model, cores, RAM and Python: enough to compare numbers across machines."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram_gib = 0.0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram_gib = int(line.split()[1]) / (1024 * 1024)
                break
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "cores_usable": usable,
        "ram_gib": round(ram_gib, 1),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "core": core_build(),
    }


def core_build() -> str:
    """Whether the admission core runs compiled (mypyc, scripts/build_core.py) or as pure
    Python: the same decisions, pure Python about three times slower."""
    import jupyter_gpuaas.admission.core as core

    return "pure Python" if core.__file__.endswith(".py") else "compiled with mypyc"


def pure_copy(dest: Path) -> Path:
    """The package's sources without compiled modules, for PYTHONPATH (pure Python)."""
    src = REPO / "jupyter_gpuaas"
    shutil.copytree(
        src, dest / "jupyter_gpuaas", ignore=shutil.ignore_patterns("*.so", "__pycache__")
    )
    return dest


def pure_env(pure: Path) -> dict[str, str]:
    """An environment whose `jupyter_gpuaas` is the copy in `pure` (`pure_copy`), run as
    pure Python: the same decisions as compiled, as a machine without a C compiler runs them.
    (PYTHONPATH goes before the editable install's path; the console script's own folder,
    first on sys.path, holds no package.)"""
    return {**os.environ, "PYTHONPATH": str(pure), "GPUAAS_PURE": "1"}


def self_max_rss_mib() -> float:
    """This process's own peak RSS so far."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1024 * 1024 if sys.platform == "darwin" else 1024)


def emit(summary: dict[str, Any], as_json: bool, text: str) -> None:
    """Print the script's result: the JSON summary (for run_all.py) or a human text."""
    if as_json:
        json.dump(summary, sys.stdout)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(text)
