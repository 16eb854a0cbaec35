"""One quota format both ways, judged by the real thing: `kueue manifests` of every scenario
we ship goes to the session's real API server, where Kueue's CRDs (schemas and CEL rules)
and the real Kueue's defaulting and validating webhooks take or refuse it, and what the
server answers is read back by `kueue import` and must equal the quota file
(tests/kueue/test_kueue_roundtrip.py does the same through the YAML text alone, and against
copies of the CRDs' schemas)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from jupyter_gpuaas.admission.config import parse_config
from jupyter_gpuaas.admission.model import Config
from jupyter_gpuaas.kubeapi.meta import cluster_flavors
from jupyter_gpuaas.kubernetes.kueue import manifests
from jupyter_gpuaas.kubernetes.kueue_import import flatten, import_objects

# The scenario list and Kueue's CEL rule live with the other Kueue tests (tests/kueue/,
# not a package), which a run of tests/kubernetes alone does not put on the path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kueue"))
from kueue_objects import config_of, kueue_refuses, scenario_configs

NAMESPACE = "kueue-round-trip"


def json_objects(text: str) -> Iterator[Any]:
    decoder, at = json.JSONDecoder(), 0
    while text[at:].strip():
        obj, end = decoder.raw_decode(text, at)
        yield obj
        at = end
        while at < len(text) and text[at].isspace():
            at += 1


def through_the_server(cluster: Any, config: Config) -> Config:
    """`kueue manifests` of `config` created as a server-side dry run (strict field
    validation; the server runs every check and webhook, defaults the objects and stores
    nothing), and the objects it answers with imported back. `create`, not `apply`: an
    object of the same name left by another test fails loudly instead of being merged."""
    docs = manifests(config, cluster_flavors(config, {}, {}), NAMESPACE)
    answer = cluster.kubectl(
        "create", "--dry-run=server", "--validate=strict", "-o", "json", "-f", "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}),
    )  # fmt: skip
    answered = list(json_objects(answer))  # kubectl prints one JSON object per object
    assert len(answered) == len(docs), answer
    # The server's own view of each object (defaults filled in, as `kubectl get` shows it).
    assert all(o["metadata"].get("creationTimestamp") for o in answered), answer
    data = import_objects(flatten(answered, "the API server's answer"))
    return parse_config(yaml.safe_load(yaml.safe_dump(data, sort_keys=False)))


@pytest.fixture(scope="module")
def namespace(cluster: Any) -> Any:
    cluster.kubectl("create", "namespace", NAMESPACE)
    yield NAMESPACE
    cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false")


def test_every_scenario_round_trips_through_the_real_api_server(
    cluster: Any, namespace: str
) -> None:
    """Every scenario Kueue can hold (the others are refused by `manifests` itself with
    the reason, tests/kueue): accepted, and `import` of the server's objects is the file."""
    configs = [(n, config_of(d)) for n, d in scenario_configs()]
    held = [(n, c) for n, c in configs if not kueue_refuses(c)]
    assert len(held) >= 80, "the scenario folders were not found"

    def judge(item: tuple[str, Config]) -> str | None:
        name, config = item
        try:
            back = through_the_server(cluster, config)
        except (RuntimeError, AssertionError) as e:
            return f"{name}: {e}"
        if back != config:
            return f"{name}: came back as {back!r}, not {config!r}"
        return None

    # Four at a time: a kubectl process each; the server answers them side by side.
    with ThreadPoolExecutor(4) as pool:
        failures = [f for f in pool.map(judge, held) if f]
    assert not failures, "\n".join(failures)


def test_the_real_kueue_refuses_what_it_cannot_hold(cluster: Any, namespace: str) -> None:
    """The check above can fail: a ClusterQueue with a misspelt field is named by the
    server, and one Kueue's CEL rule refuses (borrowWithinCohort without
    reclaimWithinCohort, which `manifests` never writes) is refused by the server."""
    config = config_of(
        {
            "flavors": {"a100": {"nodes": 1, "gpus_per_node": 2}},
            "tenants": {"vision": {"quota": {"a100": 2}, "cohort": "org"}},
        }
    )
    docs = manifests(config, cluster_flavors(config, {}, {}), namespace)
    (queue,) = [d for d in docs if d["kind"] == "ClusterQueue"]
    misspelt = json.loads(json.dumps(queue))
    misspelt["spec"]["cohortt"] = misspelt["spec"].pop("cohortName", "org")
    refused = json.loads(json.dumps(queue))
    refused["spec"]["preemption"] = {
        "reclaimWithinCohort": "Never",
        "borrowWithinCohort": {"policy": "LowerPriority"},
    }
    for bad, word in ((misspelt, "cohortt"), (refused, "reclaimWithinCohort")):
        with pytest.raises(RuntimeError, match=word):
            cluster.kubectl(
                "apply", "--dry-run=server", "--validate=strict", "-f", "-",
                input=json.dumps(bad),
            )  # fmt: skip
