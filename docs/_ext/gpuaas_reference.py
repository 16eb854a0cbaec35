"""The reference pages, generated from the code at each build so they cannot drift.

A Sphinx extension (docs/conf.py loads it): before Sphinx reads the sources, it writes
docs/reference/generated/*.md (git-ignored) from

- every traitlets option of the package (`c.Class.name`: help, type, default, bounds),
  found by importing every module of `jupyter_gpuaas` and walking its Configurable classes;
- every command of `jupyter-gpuaas` (jupyter_gpuaas/cli.py's argparse parser, subcommands
  and their arguments);
- the gateway's REST API (jupyter_gpuaas/gateway/openapi.py's `build_openapi`, also written
  as openapi.json for download);
- every metric the gateway exports (jupyter_gpuaas/gateway/metrics.py's `GatewayMetrics`,
  fed one sample of everything so each family shows its labels);
- the scenario and quota format (jupyter_gpuaas/admission/schema.py, the JSON Schema the
  loaders validate against, written as scenario.schema.json beside the page for editors).

tests/test_docs_reference.py checks, from its own walk of the code, that nothing is missing.
The functions here return the Markdown text, so the test can call them without Sphinx.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import pkgutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import traitlets
from traitlets.config import Configurable

OUT = Path(__file__).resolve().parent.parent / "reference" / "generated"


# --- configuration ---------------------------------------------------------------------


def package_modules() -> list[Any]:
    """Every module of jupyter_gpuaas, imported (an import that fails fails the build)."""
    import jupyter_gpuaas

    mods = [jupyter_gpuaas]
    for info in pkgutil.walk_packages(jupyter_gpuaas.__path__, "jupyter_gpuaas."):
        mods.append(importlib.import_module(info.name))
    return mods


def ours(cls: type) -> bool:
    return cls.__module__.split(".")[0] == "jupyter_gpuaas"


def configurable_classes() -> list[type[Configurable]]:
    """The classes an admin names in a config file: the package's Configurable classes,
    mixins (`…Mixin`) and private ones left out (their options show under each class that
    uses them), sorted by name."""
    found: dict[str, type[Configurable]] = {}
    for mod in package_modules():
        for name, obj in vars(mod).items():
            if (
                inspect.isclass(obj)
                and issubclass(obj, Configurable)
                and ours(obj)
                and not name.startswith("_")
                and not name.endswith("Mixin")
            ):
                found[obj.__name__] = obj
    return [found[k] for k in sorted(found)]


def package_options(cls: type[Configurable]) -> dict[str, traitlets.TraitType[Any, Any]]:
    """The options of `cls` that this package defines (inherited from our mixins included;
    JupyterHub's, jupyter_server's and KubeSpawner's own are in their documentation)."""
    traits = cls.class_traits(config=True)
    return {
        name: t
        for name, t in sorted(traits.items())
        if t.this_class is not None and ours(t.this_class)
    }


def _text(s: str | None) -> str:
    """Help text as Markdown paragraphs (traitlets help is indented prose)."""
    return inspect.cleandoc(s or "").strip() or "(no help text)"


def _code(value: str) -> str:
    ticks = "``" if "`" in value else "`"
    pad = " " if ticks == "``" else ""
    return f"{ticks}{pad}{value}{pad}{ticks}"


def _trait_type(t: traitlets.TraitType[Any, Any]) -> str:
    kind = type(t).__name__
    if isinstance(t, (traitlets.Enum, traitlets.CaselessStrEnum)):
        return kind + " of " + ", ".join(_code(repr(v)) for v in (t.values or ()))
    if isinstance(t, traitlets.Union):
        return "Union of " + ", ".join(type(x).__name__ for x in t.trait_types)
    return kind


def config_markdown() -> str:
    lines = [
        "# Configuration options",
        "",
        "Every option this package defines, generated from the code at each build "
        "(docs/_ext/gpuaas_reference.py). Set them in `jupyterhub_config.py` or "
        "`jupyter_server_config.py` as `c.Class.option = value`, or on the command "
        "line as `--Class.option=value`. Options a class inherits from JupyterHub, "
        "KubeSpawner or jupyter_server are documented there.",
        "",
    ]
    for cls in configurable_classes():
        options = package_options(cls)
        if not options:
            continue
        lines += [f"## {cls.__name__}", "", f"`{cls.__module__}.{cls.__name__}`", ""]
        doc = inspect.getdoc(cls)
        if doc:
            lines += [doc.split("\n\n")[0].replace("\n", " "), ""]
        for name, t in options.items():
            lines += [f"### `{cls.__name__}.{name}`", ""]
            facts = [f"type: {_trait_type(t)}", f"default: {_code(t.default_value_repr())}"]
            for bound in ("min", "max"):
                value = getattr(t, bound, None)
                if value is not None:
                    facts.append(f"{bound}imum: {_code(repr(value))}")
            if t.this_class is not cls and t.this_class is not None:
                facts.append(f"from `{t.this_class.__name__}`")
            lines += ["- " + "\n- ".join(facts), "", _text(t.help), ""]
    return "\n".join(lines)


# --- commands --------------------------------------------------------------------------


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _summaries(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Each subcommand's one-line help, as the parent's --help lists it."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return {a.dest: a.help or "" for a in action._choices_actions}
    return {}


def commands(
    parser: argparse.ArgumentParser | None = None, prefix: str = ""
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """(full command, parser) for `jupyter-gpuaas` and every subcommand, depth first."""
    if parser is None:
        from jupyter_gpuaas.cli import build_parser

        parser = build_parser()
        prefix = parser.prog
    yield prefix, parser
    for name, sub in _subcommands(parser).items():
        yield from commands(sub, f"{prefix} {name}")


def commands_markdown() -> str:
    # argparse wraps usage to the terminal's width: the page's must not depend on who builds.
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "88"
    try:
        return _commands_markdown()
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before


def _commands_markdown() -> str:
    lines = [
        "# Commands",
        "",
        "Every command of `jupyter-gpuaas`, generated from its argparse parsers at each "
        "build (docs/_ext/gpuaas_reference.py). `jupyter-gpuaas COMMAND --help` prints the same.",
        "",
    ]
    summaries: dict[str, str] = {}
    for full, parser in commands():
        depth = min(full.count(" ") + 1, 4)
        lines += ["#" * (depth + 1) + f" `{full}`", ""]
        if summaries.get(full):
            lines += [summaries[full][0].upper() + summaries[full][1:] + ".", ""]
        if parser.description:
            lines += [_text(parser.description), ""]
        summaries.update({f"{full} {k}": v for k, v in _summaries(parser).items()})
        usage = parser.format_usage().strip().removeprefix("usage: ")
        lines += ["```text", usage, "```", ""]
        rows = []
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            name = ", ".join(action.option_strings) or action.metavar or action.dest
            if isinstance(name, tuple):
                name = " ".join(name)
            text = (action.help or "").replace("%(default)s", str(action.default))
            text = text.replace("%%", "%")
            if action.option_strings and action.default not in (None, False, argparse.SUPPRESS):
                text += f" (default: {_code(str(action.default))})"
            if action.choices and not isinstance(action.choices, dict):
                text += " (one of " + ", ".join(_code(str(c)) for c in action.choices) + ")"
            rows.append(f"`{name}`\n: {' '.join(text.split()) or '(no help text)'}\n")
        if rows:
            lines += rows
    return "\n".join(lines)


# --- REST API --------------------------------------------------------------------------


def openapi() -> dict[str, Any]:
    from jupyter_gpuaas.gateway.openapi import build_openapi

    return build_openapi()


def _schema_name(content: dict[str, Any] | None) -> str:
    if not content:
        return ""
    schema = content.get("application/json", {}).get("schema", {})
    ref = schema.get("$ref", "")
    return ref.rsplit("/", 1)[-1] if ref else schema.get("type", "")


def api_markdown() -> str:
    doc = openapi()
    lines = [
        "# REST API",
        "",
        "The gateway's HTTP API, generated from the OpenAPI document it serves at "
        "`GET api/openapi.json` (jupyter_gpuaas/gateway/openapi.py) at each build. "
        "The whole document: {download}`openapi.json`. Every request carries "
        "`Authorization: token <T>` (or `Bearer <T>`).",
        "",
    ]
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if method not in ("get", "post", "put", "patch", "delete"):
                continue
            lines += [f"## `{method.upper()} {path}`", ""]
            for key in ("summary", "description"):
                if op.get(key):
                    lines += [_text(op[key]), ""]
            for p in op.get("parameters", []) + item.get("parameters", []):
                desc = " ".join(p.get("description", "").split())
                lines.append(f"- {p['in']} parameter `{p['name']}`" + (f": {desc}" if desc else ""))
            body = op.get("requestBody")
            if body:
                lines.append(f"- body: `{_schema_name(body.get('content'))}`")
            for code, resp in op.get("responses", {}).items():
                schema = _schema_name(resp.get("content"))
                desc = " ".join(resp.get("description", "").split())
                lines.append(f"- {code}: {desc}" + (f" (`{schema}`)" if schema else ""))
            lines.append("")
    lines += ["## Schemas", ""]
    for name, schema in doc["components"]["schemas"].items():
        desc = " ".join(str(schema.get("description", "")).split())
        props = ", ".join(f"`{p}`" for p in schema.get("properties", {}))
        lines += [f"### `{name}`", ""]
        if desc:
            lines += [desc, ""]
        if props:
            lines += [f"Fields: {props}", ""]
    return "\n".join(lines)


# --- metrics ---------------------------------------------------------------------------


def metric_families() -> list[tuple[str, str, str, list[str]]]:
    """(name, type, help, label names) of every family a gateway exports, read from a
    `GatewayMetrics` fed one sample of every kind (so that each family has a series to
    show its labels)."""
    from jupyter_gpuaas.devices import DeviceSample
    from jupyter_gpuaas.gateway.metrics import (
        GatewayMetrics,
        PendingCount,
        ReportedGrant,
        TenantUsage,
    )

    m = GatewayMetrics()
    m.observe_wait("t", "kernel", 1.0)
    m.inc_culled("t", "kernel")
    m.inc_preempted("t", "kernel")
    m.inc_lease_expired("t", "kernel")
    sample = DeviceSample("n", 0, 0.5, 1, 40.0, 100.0, True)
    m.set_snapshot(
        [TenantUsage("t", "f", 1, 1, 0, 0, 0)],
        [PendingCount("t", "f", "kernel", 1)],
        {"f": 1},
        {"t": 0},
        [(sample, "f", "t", "u")],
        simulated=True,
        nodes={"f": 1},
        reported=[ReportedGrant("GPU-0", "n", "t", "u", "f")],  # gpuaas_grant_info's labels
    )
    out = []
    for family in m.registry.collect():
        labels: list[str] = []
        for s in family.samples:
            labels += [k for k in s.labels if k not in labels and k != "le"]
        name = family.name + ("_total" if family.type == "counter" else "")
        out.append((name, family.type, family.documentation, labels))
    return sorted(out)


def metrics_markdown() -> str:
    lines = [
        "# Metrics",
        "",
        "Every Prometheus metric the gateway exports at `GET metrics`, generated from "
        "jupyter_gpuaas/gateway/metrics.py at each build. A histogram also has its "
        "`_bucket`, `_sum` and `_count` series; a counter, `_created`.",
        "",
    ]
    for name, kind, help_, labels in metric_families():
        lines += [f"## `{name}`", "", f"- type: {kind}"]
        if labels:
            lines.append("- labels: " + ", ".join(f"`{x}`" for x in labels))
        lines += ["", " ".join(help_.split()), ""]
    return "\n".join(lines)


# --- the scenario format ---------------------------------------------------------------


def scenario_schema() -> dict[str, Any]:
    from jupyter_gpuaas.admission.schema import SCHEMA

    return SCHEMA


def _schema_rows(schema: dict[str, Any], path: str, out: list[str]) -> None:
    required = schema.get("required", [])
    for key, sub in schema.get("properties", {}).items():
        here = f"{path}.{key}" if path else key
        _describe(sub, here, out, key in required)
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict) and extra:
        _describe(extra, f"{path}.<name>" if path else "<name>", out)


def _describe(sub: dict[str, Any], here: str, out: list[str], required: bool = False) -> None:
    kind = sub.get("type", "")
    kinds = [kind] if isinstance(kind, str) else [k for k in kind if k != "null"]
    facts = ["required"] if required else []
    if kinds:
        facts.append(" or ".join(kinds))
    if "enum" in sub:
        facts.append("one of " + ", ".join(_code(json.dumps(v)) for v in sub["enum"] if v))
    for bound in ("minimum", "exclusiveMinimum", "maximum"):
        if bound in sub:
            facts.append(f"{bound} {sub[bound]}")
    if "default" in sub:
        facts.append(f"default {_code(json.dumps(sub['default']))}")
    desc = " ".join(sub.get("description", "").split())
    out.append(f"`{here}`\n: {'; '.join(facts)}" + (f". {desc}" if desc else "") + "\n")
    if "properties" in sub or isinstance(sub.get("additionalProperties"), dict):
        _schema_rows(sub, here, out)
    if isinstance(sub.get("items"), dict) and "properties" in sub["items"]:
        _schema_rows(sub["items"], f"{here}[]", out)


def scenario_markdown() -> str:
    schema = scenario_schema()
    lines = [
        "# Scenario and quota format",
        "",
        "The format of a scenario (`jupyter-gpuaas simulate`) and of the gateway's quota "
        "file (its `flavors`, `cohorts`, `tenants` and `policy` blocks), generated from "
        "the JSON Schema the loaders validate every file against: "
        "{download}`scenario.schema.json`. Point your editor at it (for YAML, a first "
        "line `# yaml-language-server: $schema=scenario.schema.json`). The rules behind "
        "the fields are in [the admission rules](../../SCENARIO.md). A key may be left "
        "out or left empty (YAML's `key:`) wherever it is not required.",
        "",
        " ".join(schema.get("description", "").split()),
        "",
    ]
    _schema_rows(schema, "", lines)
    return "\n".join(lines)


# --- Sphinx ----------------------------------------------------------------------------

PAGES = {
    "config.md": config_markdown,
    "commands.md": commands_markdown,
    "rest-api.md": api_markdown,
    "metrics.md": metrics_markdown,
    "scenario-format.md": scenario_markdown,
}


def write_all(out: Path = OUT) -> None:
    """Write the generated pages (only those whose text changed, so an unchanged build
    reads nothing again)."""
    out.mkdir(parents=True, exist_ok=True)
    files = {name: make() for name, make in PAGES.items()}
    files["openapi.json"] = json.dumps(openapi(), indent=2) + "\n"
    files["scenario.schema.json"] = json.dumps(scenario_schema(), indent=2) + "\n"
    for name, text in files.items():
        path = out / name
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")


def setup(app: Any) -> dict[str, Any]:
    app.connect("builder-inited", lambda app: write_all())
    return {"parallel_read_safe": True, "parallel_write_safe": True}
