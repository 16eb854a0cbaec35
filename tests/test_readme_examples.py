"""The documentation's examples are run, so the pages cannot drift from what the product prints.

They were the README's; the README is a landing page now, and the examples moved with their
text into the documentation site: the simulator's tour (docs/tutorials/simulator.md) and
the gateway's curl tour (docs/tutorials/gateway-api.md).

Every fenced block of the simulator's page that starts with `$ .venv/bin/jupyter-gpuaas
simulate` is a transcript: each `$ COMMAND` line is run from the repository root with this
venv's `jupyter-gpuaas`, and the lines after it must be what the command prints, line for
line. A line `...` on the page stands for any number of printed lines (the run's own
wall-clock time, say), so the page may show less than the run prints but never something
it does not print.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SIMULATOR_PAGE = ROOT / "docs" / "tutorials" / "simulator.md"
GATEWAY_PAGE = ROOT / "docs" / "tutorials" / "gateway-api.md"
EXE = Path(sys.executable).parent / "jupyter-gpuaas"
RUNNABLE = ("$ .venv/bin/jupyter-gpuaas simulate", "$ jupyter-gpuaas simulate")
ELLIPSIS = "..."


def transcripts(text: str) -> list[tuple[str, list[str]]]:
    """(command, the output shown after it) for each command of each runnable block."""
    found: list[tuple[str, list[str]]] = []
    for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, re.M | re.S):
        lines = block.splitlines()
        if not lines or not lines[0].startswith(RUNNABLE):
            continue
        for line in lines:
            if line.startswith("$ "):
                found.append((line[2:], []))
            else:
                found[-1][1].append(line)
    return found


def matches(shown: list[str], printed: list[str]) -> bool:
    """Whether the page's lines are the printed lines, `...` standing for any run of
    lines (trailing spaces never count)."""
    shown = [line.rstrip() for line in shown]
    printed = [line.rstrip() for line in printed]

    def at(i: int, j: int) -> bool:
        if i == len(shown):
            return j == len(printed)
        if shown[i] == ELLIPSIS:
            return any(at(i + 1, k) for k in range(j, len(printed) + 1))
        return j < len(printed) and shown[i] == printed[j] and at(i + 1, j + 1)

    return at(0, 0)


def test_the_matcher_needs_every_shown_line() -> None:
    assert matches(["a", "...", "d"], ["a", "b", "c", "d"])
    assert matches(["a", "..."], ["a"])
    assert not matches(["a", "x", "..."], ["a", "b", "c"])
    assert not matches(["a"], ["a", "b"])  # without `...`, nothing may be left out


EXAMPLES = transcripts(SIMULATOR_PAGE.read_text(encoding="utf-8"))


def test_the_page_shows_the_simulator_tour() -> None:
    assert any("simulate hub_config/examples/two-teams.yaml" in cmd for cmd, _ in EXAMPLES)


@pytest.mark.parametrize(("command", "shown"), EXAMPLES, ids=[c for c, _ in EXAMPLES])
def test_a_page_command_prints_what_the_page_shows(command: str, shown: list[str]) -> None:
    argv = shlex.split(command)
    assert argv[0].endswith("jupyter-gpuaas"), command
    done = subprocess.run([str(EXE), *argv[1:]], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    printed = done.stdout.splitlines()
    assert matches(shown, printed), (
        f"{SIMULATOR_PAGE.name} shows:\n"
        + "\n".join(shown)
        + "\n\nthe command prints:\n"
        + done.stdout
    )


# --- the gateway's curl tour ------------------------------------------------------------

TOUR = "# The gateway on its own"
PAGE_PORT = "8765"


def tour_commands(text: str) -> list[tuple[str, list[str]]]:
    """The tour's commands in page order ("\\"-continued lines joined), with the lines
    the page shows after each."""
    section = text.split(TOUR, 1)[1].split("\n## ", 1)[0]
    found: list[tuple[str, list[str]]] = []
    for block in re.findall(r"^```\n(.*?)^```", section, re.M | re.S):
        continuing = False
        for line in block.splitlines():
            if continuing:
                command, shown = found[-1]
                found[-1] = (command.rstrip("\\").rstrip() + " " + line.strip(), shown)
            elif line.startswith("$ "):
                found.append((line[2:].split("   #")[0].split("  #")[0].strip(), []))
            else:
                found[-1][1].append(line)
            continuing = line.rstrip().endswith("\\") and (continuing or line.startswith("$ "))
    return found


def pattern(shown: str, ids: dict[str, str]) -> str:
    """A regular expression for a JSON answer the page shows with `…` for what it leaves
    out. A request id shown as `r-d76c…` stands for one real id, the same wherever it is
    shown (bound at its first sight, in `ids`)."""
    out = []
    groups: set[str] = set()
    for part in re.split(r"(r-[0-9a-f]+…|…)", " ".join(shown.split())):
        if part == "…":
            out.append(".*?")
        elif part.startswith("r-") and part.endswith("…"):
            name = "id_" + part[2:-1]
            if part in ids:
                out.append(re.escape(ids[part]))
            elif name in groups:
                out.append(f"(?P={name})")
            else:
                groups.add(name)
                out.append(f"(?P<{name}>r-[0-9a-f]+)")
        else:
            out.append(re.escape(part))
    return "".join(out)


@pytest.mark.slow
def test_the_gateway_tour_prints_what_the_page_shows(tmp_path: Path) -> None:
    """Every command of the page's curl tour, run against a real gateway started the way
    the page starts it (on a free port instead of 8765), prints what the page shows."""
    import shutil

    from helpers import free_port, stop, wait_for

    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    port = str(free_port())
    ids: dict[str, str] = {}
    background: list[tuple[subprocess.Popen[bytes], Path, list[str]]] = []
    gateway: subprocess.Popen[bytes] | None = None
    health = f"http://127.0.0.1:{port}/api/health"

    def check(command: str, shown: list[str], printed: str) -> None:
        regex = pattern("\n".join(shown), ids)
        found = re.fullmatch(regex, " ".join(printed.split()), re.S)
        assert found, (
            f"$ {command}\n{GATEWAY_PAGE.name} shows:\n"
            + "\n".join(shown)
            + f"\nprinted:\n{printed}"
        )
        for name, value in found.groupdict().items():
            ids[f"r-{name[3:]}…"] = value

    commands = tour_commands(GATEWAY_PAGE.read_text(encoding="utf-8"))
    assert [c.split()[0] for c, _ in commands][:3] == ["cat", "cat", ".venv/bin/jupyter-gpuaas"]
    try:
        for command, shown in commands:
            argv = command.replace(PAGE_PORT, port)
            for shown_id, real in ids.items():
                argv = argv.replace(shown_id, real)
            if argv.startswith("cat "):
                (tmp_path / argv.split()[1]).write_text("\n".join(shown) + "\n")
            elif argv.startswith(".venv/bin/jupyter-gpuaas gateway"):
                args = shlex.split(argv)[1:]
                log = open(tmp_path / "gateway.log", "wb")  # noqa: SIM115 (closed by stop)
                gateway = subprocess.Popen([str(EXE), *args], cwd=tmp_path, stdout=log,
                                           stderr=subprocess.STDOUT)  # fmt: skip
                wait_for(lambda: subprocess.run(["curl", "-sf", health], capture_output=True)
                         .returncode == 0, timeout=60, what="the gateway")  # fmt: skip
            elif argv.startswith("curl -N"):  # a stream: read at the end
                out = tmp_path / f"stream-{len(background)}.txt"
                with open(out, "wb") as sink:
                    proc = subprocess.Popen(shlex.split(argv.replace("curl", "curl -s", 1)),
                                            cwd=tmp_path, stdout=sink)  # fmt: skip
                background.append((proc, out, shown))
                # Connected (the gateway's first line, ": connected") before the next
                # command acts.
                wait_for(lambda out=out: out.stat().st_size > 0, timeout=30,
                         what="the event stream to connect")  # fmt: skip
            else:
                assert argv.startswith("curl "), command
                done = subprocess.run(shlex.split(argv.replace("curl", "curl -s", 1)),
                                      cwd=tmp_path, capture_output=True, text=True,
                                      timeout=60)  # fmt: skip
                assert done.returncode == 0, (command, done.stderr)
                check(command, shown, done.stdout)
        assert background, "the tour follows an event stream"
        for _proc, out, shown in background:
            regex = pattern("\n".join(shown), ids)
            wait_for(lambda out=out, regex=regex: re.fullmatch(  # type: ignore[misc]
                regex, " ".join(out.read_text().split()), re.S), timeout=30,
                what="the stream shows what the page shows",
                detail=lambda out=out: out.read_text())  # fmt: skip
    finally:
        for proc, _, _ in background:
            stop(proc, 5)
        if gateway is not None:
            stop(gateway, 20)
