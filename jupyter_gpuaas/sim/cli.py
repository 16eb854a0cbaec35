"""`jupyter-gpuaas simulate SCENARIO [--set KEY=VALUE]... [--events FILE] [--json]
[--until SECONDS] [--estimates [EVERY]] [--plot FILE]`, and `jupyter-gpuaas simulate compare A B
[--set KEY=VALUE]... [--json] [--plot FILE]` (sim/compare.py: two runs side by side; `--set`
changes B only, so `compare mine.yaml mine.yaml --set ...` is a what-if on one file).

Bad input is the user's mistake, not ours: it exits 2 with one line on stderr naming the
key and the problem, and never a traceback. Failures inside the simulator itself are bugs
and are left to raise.
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import math
import sys
import time
from typing import Any

from jupyter_gpuaas.admission.config import SpecError

PROG = "jupyter-gpuaas simulate"


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative number: {text!r}")
    return value


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "simulate",
        help="replay a scenario through the admission core on a virtual clock",
        description="Replay a scenario (YAML or JSON) through the admission core on a "
        "virtual clock and report waits, utilization and per-tenant usage.",
    )
    parser.add_argument(
        "scenario",
        metavar="SCENARIO",
        help="scenario file (YAML or JSON); or `compare A B` to compare two runs",
    )
    # `compare A B`: the two scenario files after the word compare.
    parser.add_argument("more", nargs="*", help=argparse.SUPPRESS)
    parser.add_argument(
        "--plot",
        metavar="FILE",
        help="draw queue length, GPUs allocated and waits over time into a PNG (matplotlib)",
    )
    parser.add_argument("--events", metavar="FILE", help="write every decision as JSON lines")
    parser.add_argument(
        "--json", action="store_true", help="print the result object as JSON, nothing else"
    )
    parser.add_argument(
        "--until",
        metavar="SECONDS",
        type=_seconds,
        help="stop the clock here (overrides the scenario's until)",
    )
    parser.add_argument(
        "--estimates",
        nargs="?",
        const=1,
        type=int,
        metavar="EVERY",
        help="backtest the wait estimates: each request gets the estimate it would have "
        "been shown at submit (eta_at_submit in --json), and the report their accuracy; "
        "with EVERY, only one arrival instant in EVERY is estimated (a sample)",
    )
    parser.add_argument(
        "--progress",
        action="store_true",
        help="show how far the clock has run on stderr even when stderr is not a terminal "
        "(on a terminal it is shown anyway); never on stdout",
    )
    parser.add_argument(
        "--set",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        dest="overrides",
        help="override a scenario key, dotted (tenants.vision.quota.a100=6, "
        "policy.idle_timeout=1200); the value is read as YAML; repeatable",
    )
    parser.set_defaults(run=run, exit_at_once=True)
    return parser


def _plot_one(scenario: Any, result: dict[str, Any], events: str, path: str) -> int:
    from jupyter_gpuaas.sim.compare import Run, plot

    run = Run(scenario, result, [json.loads(line) for line in events.splitlines()])
    try:
        plot([(scenario.name or "scenario", run)], path)
    except ImportError:
        return _error("--plot needs matplotlib: pip install 'jupyter-gpuaas[plot]'")
    except OSError as exc:
        return _error(f"{path}: cannot write: {exc.strerror or exc}")
    return 0


def _error(message: str) -> int:
    print(f"{PROG}: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    # A batch run: no cyclic garbage collection at all. A long trace keeps millions of
    # objects alive (requests, the core's state, every decision), and the collector's
    # passes over them cost ~0.6 s of a month (parsing its CSV alone started passes worth
    # 0.15 s) and find nothing: loading, replaying and reporting make no reference cycles
    # (test_sim_cli.py checks that they leave none behind), so reference counting alone
    # frees what there is to free, as before.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _run(args)
    finally:
        # As it was, for a caller that runs us in its own process (main(argv) in tests):
        # this run's objects frozen first (a list splice), or the first pass after
        # enable() would walk every one of them.
        gc.freeze()
        if was_enabled:
            gc.enable()


def _compare(args: argparse.Namespace) -> int:
    from jupyter_gpuaas.sim.compare import compare, format_compare, plot, simulate
    from jupyter_gpuaas.sim.scenario import load_scenario, parse_override

    if len(args.more) != 2:
        return _error("compare needs two scenario files: simulate compare A B [--set ...]")
    a_path, b_path = args.more
    try:
        overrides = [parse_override(text) for text in args.overrides]
        a = load_scenario(a_path)
        b = load_scenario(b_path, overrides)
    except SpecError as exc:
        return _error(str(exc))
    runs = [
        simulate(
            s,
            args.until,
            keep_events=bool(args.plot),
            progress=_progress(args, s, _until(args, s), f"simulate compare {name}"),
        )
        for name, s in (("A", a), ("B", b))
    ]
    table = compare(*runs)
    b_name = b_path + "".join(f" --set {o}" for o in args.overrides)
    if args.plot:
        try:
            plot([("A", runs[0]), ("B", runs[1])], args.plot)
        except ImportError:
            return _error("--plot needs matplotlib: pip install 'jupyter-gpuaas[plot]'")
        except OSError as exc:
            return _error(f"{args.plot}: cannot write: {exc.strerror or exc}")
    if args.json:
        sys.stdout.write(json.dumps({"a": a_path, "b": b_name, **table}) + "\n")
    else:
        sys.stdout.write(format_compare(table, a_path, b_name))
    return 0


def _until(args: argparse.Namespace, scenario: Any) -> float | None:
    """Where the clock stops: --until, else the scenario's own `until`."""
    until: float | None = args.until if args.until is not None else scenario.until
    return until


def _progress(
    args: argparse.Namespace, scenario: Any, until: float | None, label: str = "simulate"
) -> Any:
    """A Progress on stderr when it is a terminal or --progress asks (else None)."""
    terminal = sys.stderr.isatty()
    if not (terminal or getattr(args, "progress", False)):
        return None
    from jupyter_gpuaas.sim.progress import Progress, expected_end

    end = expected_end(until, scenario.requests)
    return Progress(end, sys.stderr, terminal=terminal, label=label)


def _run(args: argparse.Namespace) -> int:
    from jupyter_gpuaas.sim.report import Tally, format_table
    from jupyter_gpuaas.sim.scenario import load_scenario, parse_override

    if args.scenario == "compare" and args.more:
        return _compare(args)
    if args.more:
        return _error(f"unexpected arguments after {args.scenario}: {' '.join(args.more)}")

    try:
        overrides = [parse_override(text) for text in getattr(args, "overrides", [])]
        scenario = load_scenario(args.scenario, overrides)
    except SpecError as exc:
        return _error(str(exc))
    events_file = None
    plot_events = io.StringIO() if getattr(args, "plot", None) else None
    if args.events:
        try:
            events_file = open(args.events, "w", encoding="utf-8")  # noqa: SIM115
        except OSError as exc:
            return _error(f"{args.events}: cannot write: {exc.strerror or exc}")

    from jupyter_gpuaas.sim.backtest import Backtest, format_estimates
    from jupyter_gpuaas.sim.driver import run_scenario

    every = getattr(args, "estimates", None)
    if every is not None and every < 1:
        return _error(f"--estimates: must be a whole number at least 1, not {every}")
    backtest = Backtest(scenario, every) if every is not None else None

    until = _until(args, scenario)
    # The decisions go to the report (and the events file) as they are made, and are
    # not kept: a month's would take half the process's memory.
    progress = _progress(args, scenario, until)
    tally = Tally(scenario, events_file if plot_events is None else plot_events, progress)
    try:
        started = time.perf_counter()
        if backtest is None:
            sim = run_scenario(scenario, until=until, tally=tally)
        else:
            # Every idle spell told to the core, as a gateway hears each from heartbeats:
            # the estimates see the idle holders a gateway would (the decisions are the
            # same either way, tests/test_quiet_spells.py).
            sim = run_scenario(
                scenario, until=until, tally=tally, backtest=backtest, every_spell=True
            )
        wall = time.perf_counter() - started
        if progress is not None:
            progress.finish(sim.end)
        tally.flush()
    finally:
        if events_file is not None:
            events_file.close()
    # The core at the end of the clock says why each request still queued waits.
    waiting_for = getattr(getattr(sim, "core", None), "waiting_for", None)
    result = tally.result(sim.end, wall, waiting_for)
    if backtest is not None:
        backtest.apply(result)
    if plot_events is not None:
        if events_file is not None:
            with open(args.events, "w", encoding="utf-8") as f:
                f.write(plot_events.getvalue())
        code = _plot_one(scenario, result, plot_events.getvalue(), args.plot)
        if code:
            return code
    if args.json:
        # dumps, not dump: dump encodes in pure Python, chunk by chunk (1.5 s for a month).
        sys.stdout.write(json.dumps(result))
        sys.stdout.write("\n")
    else:
        title = f"scenario {scenario.name}" if scenario.name else "scenario"
        sys.stdout.write(f"{title}\n\n{format_table(result)}")
        sys.stdout.write(format_estimates(result["summary"]))
    return 0
