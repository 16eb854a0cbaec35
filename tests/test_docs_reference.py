"""The documentation's generated reference is complete: nothing a user can set, run or
scrape is missing from it.

docs/_ext/gpuaas_reference.py writes the reference pages from the code at each `make docs`.
These tests write them into a temporary directory and compare them with what the code
offers, found here by other means than the generator's own walk where one exists: every
traitlets option of every class in the package (including mixins and HasTraits knobs), every
option string of every argparse command, every `gpuaas_*` name written in the metrics
module's source, every path of the OpenAPI document, every key of the scenario schema.
"""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import traitlets

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

import gpuaas_reference  # noqa: E402

import jupyter_gpuaas  # noqa: E402
from jupyter_gpuaas.admission.schema import QUOTAS_SCHEMA, SCHEMA  # noqa: E402
from jupyter_gpuaas.admission.values import SpecError  # noqa: E402
from jupyter_gpuaas.sim.schema_check import check_schema  # noqa: E402


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("reference")
    gpuaas_reference.write_all(out)
    return {p.name: p.read_text(encoding="utf-8") for p in out.iterdir()}


def package_classes() -> list[type]:
    """Every class defined in the package (every module imported)."""
    found: dict[str, type] = {}
    for info in pkgutil.walk_packages(jupyter_gpuaas.__path__, "jupyter_gpuaas."):
        mod = importlib.import_module(info.name)
        for obj in vars(mod).values():
            if inspect.isclass(obj) and obj.__module__ == mod.__name__:
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return list(found.values())


def test_every_configurable_option_is_in_the_reference(pages: dict[str, str]) -> None:
    """Each option is documented under its own class or under a class that inherits it
    (a mixin's options under each spawner that has them)."""
    documented = re.findall(r"^### `(\w+)\.(\w+)`$", pages["config.md"], re.M)
    by_name = {c.__name__: c for c in package_classes()}
    missing = []
    count = 0
    for cls in by_name.values():
        if not issubclass(cls, traitlets.HasTraits):
            continue
        for name in cls.class_own_traits(config=True):
            count += 1
            if not any(
                opt == name and owner in by_name and issubclass(by_name[owner], cls)
                for owner, opt in documented
            ):
                missing.append(f"{cls.__name__}.{name}")
    assert count > 100, count  # the walk found the package's options at all
    assert not missing, f"options missing from the configuration reference: {missing}"


def test_the_reference_gives_help_default_and_bounds(pages: dict[str, str]) -> None:
    text = pages["config.md"]
    # The two the issue found undocumented anywhere.
    assert "### `GpuaasExtension.submit_wait`" in text
    assert "### `GpuaasKubernetesProvisioner.service_account`" in text
    from jupyter_gpuaas.gateway.app import GatewayApp

    bounded = [
        (name, t)
        for name, t in GatewayApp.class_own_traits(config=True).items()
        if getattr(t, "min", None) is not None
    ]
    assert bounded, "GatewayApp has options with a lower bound"
    for name, t in bounded:
        section = text.split(f"### `GatewayApp.{name}`", 1)[1].split("\n### ", 1)[0]
        assert f"minimum: `{t.min!r}`" in section, name
        assert f"default: `{t.default_value_repr()}`" in section, name
        assert " ".join(inspect.cleandoc(t.help).split())[:40] in " ".join(section.split())


def test_every_command_and_flag_is_in_the_reference(pages: dict[str, str]) -> None:
    import argparse

    from jupyter_gpuaas.cli import build_parser

    text = pages["commands.md"]
    sections = re.split(r"^#{2,5} `(jupyter-gpuaas[^`]*)`$", text, flags=re.M)
    by_command = dict(zip(sections[1::2], sections[2::2], strict=True))

    def walk(parser: argparse.ArgumentParser, full: str) -> int:
        assert full in by_command, f"command missing from the reference: {full}"
        n = 1
        for action in parser._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"`{flag}" in by_command[full] or f", {flag}" in by_command[full], (
                        f"{full} {flag} is missing from the command reference"
                    )
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    n += walk(sub, f"{full} {name}")
        return n

    assert walk(build_parser(), "jupyter-gpuaas") > 10


def test_every_metric_is_in_the_reference(pages: dict[str, str]) -> None:
    """Every metric name the metrics module writes, read from its source text (not from the
    registry the generator reads), and every one INTERFACES.md promises."""
    source = (ROOT / "jupyter_gpuaas" / "gateway" / "metrics.py").read_text()
    written = set(re.findall(r'"(gpuaas_[a-z_]+)"', source))
    promised = set(re.findall(r"`(gpuaas_[a-z_]+)", (ROOT / "docs" / "INTERFACES.md").read_text()))
    documented = set(re.findall(r"^## `(gpuaas_[a-z_]+)`$", pages["metrics.md"], re.M))
    assert len(written) > 15
    # A counter is exported as NAME_total, which is the name a query uses.
    missing = {
        name
        for name in written | promised
        if name not in documented and f"{name}_total" not in documented
        and not any(name.startswith(d) for d in documented)  # a histogram's _bucket, say
    }  # fmt: skip
    assert not missing, f"metrics missing from the reference: {sorted(missing)}"


def test_every_api_path_is_in_the_reference(pages: dict[str, str]) -> None:
    from jupyter_gpuaas.gateway.openapi import build_openapi

    doc = build_openapi()
    for path, item in doc["paths"].items():
        for method in item:
            if method in ("get", "post", "put", "patch", "delete"):
                assert f"## `{method.upper()} {path}`" in pages["rest-api.md"], (method, path)
    assert json.loads(pages["openapi.json"]) == json.loads(json.dumps(doc))


def _keys(schema: dict[str, Any], path: str = "") -> list[str]:
    out = []
    for key, sub in schema.get("properties", {}).items():
        here = f"{path}.{key}" if path else key
        out += [here, *_keys(sub, here)]
        if isinstance(sub.get("additionalProperties"), dict):
            out += _keys(sub["additionalProperties"], f"{here}.<name>")
        if isinstance(sub.get("items"), dict):
            out += _keys(sub["items"], f"{here}[]")
    return out


def test_every_scenario_key_is_in_the_reference(pages: dict[str, str]) -> None:
    keys = _keys(SCHEMA)
    assert "tenants.<name>.preemption.reclaim_within_cohort" in keys
    assert "requests[].busy" in keys
    for key in keys:
        assert f"`{key}`" in pages["scenario-format.md"], key
    assert json.loads(pages["scenario.schema.json"]) == json.loads(json.dumps(SCHEMA))


def test_the_schema_is_a_valid_json_schema() -> None:
    import jsonschema

    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    jsonschema.Draft202012Validator.check_schema(QUOTAS_SCHEMA)


@pytest.mark.parametrize(
    "path",
    sorted((ROOT / "tests" / "scenarios").glob("*.yaml"))
    + sorted((ROOT / "hub_config" / "examples").glob("*.yaml")),
    ids=lambda p: p.name,
)
def test_every_shipped_scenario_meets_the_schema(path: Path) -> None:
    """The schema accepts what the parsers accept (the loaders run both; a schema stricter
    than the parsers would refuse a file the rules allow)."""
    import yaml

    check_schema(yaml.safe_load(path.read_text()))


def test_the_quota_files_meet_the_quota_schema() -> None:
    import yaml

    for path in [ROOT / "hub_config" / "local" / "quotas.yaml"]:
        check_schema(yaml.safe_load(path.read_text()), QUOTAS_SCHEMA)


@pytest.mark.parametrize(
    ("doc", "key"),
    [
        ({"flavors": {"a": {"nodes": -1, "gpus_per_node": 4}}, "tenants": {}}, "flavors.a.nodes"),
        ({"flavors": {}, "tenants": {"v": {"queueing": "Fifo"}}}, "tenants.v.queueing"),
        ({"flavors": {}, "tenants": {}, "requests": [{"id": "x"}]}, "requests[0]"),
        ({"flavors": {}, "tenants": {}, "policy": {"idel_timeout": 1}}, "policy"),
    ],
)  # fmt: skip
def test_a_schema_error_names_the_field(doc: dict[str, Any], key: str) -> None:
    with pytest.raises(SpecError) as err:
        check_schema(doc)
    assert err.value.key == key
    assert "scenario.schema.json" in err.value.problem


def test_the_quota_schema_refuses_requests() -> None:
    with pytest.raises(SpecError) as err:
        check_schema({"flavors": {}, "tenants": {}, "requests": []}, QUOTAS_SCHEMA)
    assert err.value.key == ""
    assert "requests" in err.value.problem
