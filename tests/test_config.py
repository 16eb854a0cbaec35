"""parse_config: every validation rule names its key; valid blocks become the model.

`CONFIG_CASES` is also replayed through the real CLI by test_sim_cli_parsing.py, so each
rule is checked both in-process and as the one-line error a user sees.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from jupyter_gpuaas.admission.config import (
    DEFAULT_CULL_WARNING,
    SpecError,
    default_cull_warning,
    parse_config,
)
from jupyter_gpuaas.admission.model import Autoscale, Policy, Preemption

DELETE = object()


def base_config() -> dict[str, Any]:
    """A valid config touching every block, to be broken one key at a time."""
    return {
        "flavors": {
            "a100": {"nodes": 2, "gpus_per_node": 4},
            "t4": {"nodes": 1, "gpus_per_node": 8},
        },
        "tenants": {
            "vision": {
                "cohort": "research",
                "quota": {"a100": 4, "t4": 0},
                "borrowing_limit": {"a100": 2},
                "lending_limit": {"a100": 1},
                "weight": 2,
                "queueing": "StrictFIFO",
                "preemption": {
                    "within_tenant": "LowerPriority",
                    "reclaim_within_cohort": "Any",
                    "borrow_within_cohort": "LowerPriority",
                },
                "idle_timeout": 300,
                "reservation_ttl": 60,
            },
            "nlp": {"cohort": "research", "quota": {"t4": 4, "a100": 4}},
            "solo": {"quota": {"t4": 2}},
        },
        "policy": {
            "fair_sharing": True,
            "idle_timeout": 600,
            "reservation_ttl": 120,
            "cull_warning": 60,
            "lease_ttl": 90,
            "autoscale": {"a100": {"max_nodes": 4, "provision_delay": 300}},
        },
    }


def mutate(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of `doc` with the dotted `path` set to `value` (or deleted with DELETE)."""
    doc = copy.deepcopy(doc)
    *parents, last = path.split(".")
    node = doc
    for part in parents:
        node = node.setdefault(part, {})
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return doc


NON_NEG_INT = "must be a non-negative integer"
POS_INT = "must be a positive integer"
NON_NEG_NUM = "must be a non-negative number"

# (test id, dotted path to change, new value, key named in the error, words in the problem)
CONFIG_CASES: list[tuple[str, str, Any, str, str]] = [
    # The cohort tree (a top-level `cohorts:`): vision and nlp name "research".
    (
        "cohort-cycle",
        "cohorts",
        {"research": {"parent": "org"}, "org": {"parent": "research"}},
        "cohorts.research.parent",
        "makes a cycle: research -> org -> research",
    ),
    (
        "cohort-unknown-parent",
        "cohorts",
        {"research": {"parent": "org"}},
        "cohorts.research.parent",
        "unknown cohort 'org'",
    ),
    (
        "tenant-names-unknown-cohort",
        "cohorts",
        {"org": {}},
        "tenants.vision.cohort",
        "unknown cohort 'research'",
    ),
    (
        "cohort-named-like-tenant",
        "cohorts",
        {"research": {}, "solo": {}},
        "cohorts.solo",
        "named like a tenant",
    ),
    (
        "negative-cohort-quota",
        "cohorts",
        {"research": {"quota": {"a100": -1}}},
        "cohorts.research.quota.a100",
        NON_NEG_INT,
    ),
    (
        "negative-cohort-borrowing-limit",
        "cohorts",
        {"org": {}, "research": {"parent": "org", "borrowing_limit": {"a100": -2}}},
        "cohorts.research.borrowing_limit.a100",
        NON_NEG_INT,
    ),
    (
        "root-cohort-has-no-limits",
        "cohorts",
        {"research": {"lending_limit": {"a100": 1}}},
        "cohorts.research.lending_limit",
        "root cohort",
    ),
    (
        "unknown-cohort-key",
        "cohorts",
        {"research": {"parnt": "org"}},
        "cohorts.research.parnt",
        "unknown key",
    ),
    (
        "cohort-quota-unknown-flavor",
        "cohorts",
        {"research": {"quota": {"h100": 1}}},
        "cohorts.research.quota.h100",
        "unknown flavor",
    ),
    ("unknown-top-key", "quotas", {}, "quotas", "unknown key"),
    ("unknown-flavor-key", "flavors.a100.colour", "green", "flavors.a100.colour", "unknown key"),
    (
        "unknown-tenant-key",
        "tenants.vision.borowing_limit",
        {},
        "tenants.vision.borowing_limit",
        "unknown key",
    ),
    (
        "unknown-preemption-key",
        "tenants.vision.preemption.within_cohort",
        "Never",
        "tenants.vision.preemption.within_cohort",
        "unknown key",
    ),
    ("unknown-policy-key", "policy.idle_timout", 5, "policy.idle_timout", "unknown key"),
    (
        "unknown-autoscale-key",
        "policy.autoscale.a100.max",
        5,
        "policy.autoscale.a100.max",
        "unknown key",
    ),
    ("missing-flavors", "flavors", DELETE, "flavors", "is required"),
    ("missing-quota", "tenants.solo.quota", DELETE, "tenants.solo.quota", "is required"),
    ("flavors-not-mapping", "flavors", ["a100"], "flavors", "must be a mapping"),
    ("bool-quota", "tenants.vision.quota.a100", True, "tenants.vision.quota.a100", NON_NEG_INT),
    ("bool-nodes", "flavors.a100.nodes", False, "flavors.a100.nodes", NON_NEG_INT),
    ("string-quota", "tenants.vision.quota.a100", "4", "tenants.vision.quota.a100", NON_NEG_INT),
    ("negative-quota", "tenants.vision.quota.a100", -1, "tenants.vision.quota.a100", NON_NEG_INT),
    (
        "fractional-quota",
        "tenants.vision.quota.a100",
        2.5,
        "tenants.vision.quota.a100",
        NON_NEG_INT,
    ),
    ("float-quota", "tenants.nlp.quota.t4", 4.0, "tenants.nlp.quota.t4", NON_NEG_INT),
    (
        "fractional-gpus-per-node",
        "flavors.t4.gpus_per_node",
        1.5,
        "flavors.t4.gpus_per_node",
        POS_INT,
    ),
    ("zero-gpus-per-node", "flavors.t4.gpus_per_node", 0, "flavors.t4.gpus_per_node", POS_INT),
    ("negative-nodes", "flavors.a100.nodes", -1, "flavors.a100.nodes", NON_NEG_INT),
    (
        "negative-limit",
        "tenants.vision.borrowing_limit.a100",
        -2,
        "tenants.vision.borrowing_limit.a100",
        NON_NEG_INT,
    ),
    (
        "quota-unknown-flavor",
        "tenants.vision.quota.h100",
        1,
        "tenants.vision.quota.h100",
        "unknown flavor 'h100'",
    ),
    (
        "borrowing-flavor-not-in-quota",
        "tenants.nlp.borrowing_limit",
        {"h100": 1},
        "tenants.nlp.borrowing_limit.h100",
        "not in the tenant's quota",
    ),
    (
        "lending-flavor-not-in-quota",
        "tenants.vision.lending_limit",
        {"t5": 1},
        "tenants.vision.lending_limit.t5",
        "not in the tenant's quota",
    ),
    (
        "borrowing-without-cohort",
        "tenants.solo.borrowing_limit",
        {"t4": 1},
        "tenants.solo.borrowing_limit",
        "needs a cohort",
    ),
    (
        "lending-without-cohort",
        "tenants.solo.lending_limit",
        {"t4": 1},
        "tenants.solo.lending_limit",
        "needs a cohort",
    ),
    (
        "lending-above-nominal",
        "tenants.vision.lending_limit.a100",
        5,
        "tenants.vision.lending_limit.a100",
        "above the nominal quota 4",
    ),
    ("zero-weight", "tenants.nlp.weight", 0, "tenants.nlp.weight", "must be a positive number"),
    (
        "negative-weight",
        "tenants.nlp.weight",
        -1,
        "tenants.nlp.weight",
        "must be a positive number",
    ),
    ("bool-weight", "tenants.nlp.weight", True, "tenants.nlp.weight", "must be a positive number"),
    ("cohort-not-string", "tenants.nlp.cohort", 3, "tenants.nlp.cohort", "non-empty string"),
    (
        "unknown-queueing",
        "tenants.nlp.queueing",
        "FIFO",
        "tenants.nlp.queueing",
        "BestEffortFIFO, StrictFIFO",
    ),
    (
        "unknown-within-tenant",
        "tenants.nlp.preemption.within_tenant",
        "Always",
        "tenants.nlp.preemption.within_tenant",
        "Never, LowerPriority, LowerOrNewerEqualPriority",
    ),
    (
        "unknown-reclaim",
        "tenants.nlp.preemption.reclaim_within_cohort",
        "Sometimes",
        "tenants.nlp.preemption.reclaim_within_cohort",
        "Never, LowerPriority, Any",
    ),
    (
        "unknown-borrow-preemption",
        "tenants.nlp.preemption.borrow_within_cohort",
        "Any",
        "tenants.nlp.preemption.borrow_within_cohort",
        "Never, LowerPriority",
    ),
    ("fair-sharing-not-bool", "policy.fair_sharing", "yes", "policy.fair_sharing", "true or false"),
    (
        "autoscale-unknown-flavor",
        "policy.autoscale.h100",
        {"max_nodes": 2},
        "policy.autoscale.h100",
        "unknown flavor 'h100'",
    ),
    (
        "autoscale-below-nodes",
        "policy.autoscale.a100.max_nodes",
        1,
        "policy.autoscale.a100.max_nodes",
        "below the flavor's 2 nodes",
    ),
    (
        "autoscale-missing-max",
        "policy.autoscale.a100.max_nodes",
        DELETE,
        "policy.autoscale.a100.max_nodes",
        "is required",
    ),
    (
        "negative-provision-delay",
        "policy.autoscale.a100.provision_delay",
        -1,
        "policy.autoscale.a100.provision_delay",
        NON_NEG_NUM,
    ),
    (
        "negative-scale-down",
        "policy.autoscale.a100.scale_down_after",
        -5,
        "policy.autoscale.a100.scale_down_after",
        NON_NEG_NUM,
    ),
    ("negative-idle-timeout", "policy.idle_timeout", -1, "policy.idle_timeout", NON_NEG_NUM),
    (
        "negative-reservation-ttl",
        "policy.reservation_ttl",
        -0.5,
        "policy.reservation_ttl",
        NON_NEG_NUM,
    ),
    ("negative-cull-warning", "policy.cull_warning", -1, "policy.cull_warning", NON_NEG_NUM),
    ("negative-lease-ttl", "policy.lease_ttl", -1, "policy.lease_ttl", NON_NEG_NUM),
    (
        "infinite-idle-timeout",
        "policy.idle_timeout",
        float("inf"),
        "policy.idle_timeout",
        NON_NEG_NUM,
    ),
    (
        "negative-tenant-idle-timeout",
        "tenants.vision.idle_timeout",
        -1,
        "tenants.vision.idle_timeout",
        NON_NEG_NUM,
    ),
    (
        "string-tenant-ttl",
        "tenants.vision.reservation_ttl",
        "1h",
        "tenants.vision.reservation_ttl",
        NON_NEG_NUM,
    ),
    (
        "negative-preemption-grace",
        "policy.preemption_grace",
        -1,
        "policy.preemption_grace",
        NON_NEG_NUM,
    ),
    (
        "string-tenant-preemption-grace",
        "tenants.nlp.preemption_grace",
        "5 min",
        "tenants.nlp.preemption_grace",
        NON_NEG_NUM,
    ),
]


def test_base_config_is_valid_and_builds_the_model() -> None:
    config = parse_config(base_config())
    assert list(config.flavors) == ["a100", "t4"]
    assert config.flavors["t4"].gpus_per_node == 8
    vision = config.tenants["vision"]
    assert vision.cohort == "research"
    assert vision.borrowing_limit == {"a100": 2}
    assert vision.lending_limit == {"a100": 1}
    assert vision.weight == 2.0
    assert vision.queueing == "StrictFIFO"
    assert vision.preemption == Preemption("LowerPriority", "Any", "LowerPriority")
    assert (vision.idle_timeout, vision.reservation_ttl) == (300.0, 60.0)
    assert config.policy.autoscale["a100"] == Autoscale(max_nodes=4, provision_delay=300.0)
    assert config.policy.cull_warning == 60.0
    assert config.policy.lease_ttl == 90.0
    assert config.policy.fair_sharing is True


def test_the_gateway_default_cull_warning_fits_the_shortest_idle_timeout() -> None:
    """The scenario format warns only when asked (0); the gateway's default lead is five
    minutes, or half the shortest idle timeout (policy or tenant) when that is shorter."""
    flavors = {"a100": {"nodes": 1, "gpus_per_node": 2}}

    def default(policy: dict[str, Any], vision: dict[str, Any] | None = None) -> float:
        tenants = {"vision": {"quota": {"a100": 2}, **(vision or {})}}
        config = parse_config({"flavors": flavors, "tenants": tenants, "policy": policy})
        assert config.policy.cull_warning == 0.0  # what a scenario gets
        return default_cull_warning(config)

    assert default({"idle_timeout": 1800}) == DEFAULT_CULL_WARNING == 300.0
    assert default({"idle_timeout": 180}) == 90.0
    assert default({"idle_timeout": 1800}, {"idle_timeout": 120}) == 60.0
    assert default({"idle_timeout": 0}, {"idle_timeout": 0}) == 0.0
    assert default({}) == 0.0


def test_preemption_grace_in_policy_and_per_tenant() -> None:
    """Absent: 0 in policy and None (the policy's) per tenant; a tenant's own wins."""
    config = parse_config(base_config())
    assert config.policy.preemption_grace == 0.0
    assert config.tenants["nlp"].preemption_grace is None
    doc = base_config()
    doc["policy"]["preemption_grace"] = 300
    doc["tenants"]["nlp"]["preemption_grace"] = 60
    config = parse_config(doc)
    assert config.policy.preemption_grace == 300.0
    assert config.tenants["nlp"].preemption_grace == 60.0
    assert config.tenants["vision"].preemption_grace is None


def test_quota_key_order_is_flavor_preference_order() -> None:
    config = parse_config(base_config())
    assert list(config.tenants["nlp"].quota) == ["t4", "a100"]
    assert list(config.tenants["vision"].quota) == ["a100", "t4"]


def test_defaults() -> None:
    config = parse_config(
        {"flavors": {"a100": {"nodes": 0, "gpus_per_node": 1}}, "tenants": {"t": {"quota": {}}}}
    )
    tenant = config.tenants["t"]
    assert tenant.cohort is None
    assert tenant.weight == 1.0
    assert tenant.queueing == "BestEffortFIFO"
    assert tenant.preemption == Preemption()
    assert tenant.idle_timeout is None and tenant.reservation_ttl is None
    assert config.policy == Policy()


def test_explicit_nulls_mean_absent() -> None:
    doc = mutate(base_config(), "tenants.nlp.cohort", None)
    doc = mutate(doc, "policy.autoscale", None)
    doc = mutate(doc, "tenants.vision.preemption.borrow_within_cohort", None)
    config = parse_config(doc)
    assert config.tenants["nlp"].cohort is None
    assert config.policy.autoscale == {}
    assert config.tenants["vision"].preemption.borrow_within_cohort == "Never"


def test_lending_limit_equal_to_nominal_is_fine() -> None:
    config = parse_config(mutate(base_config(), "tenants.vision.lending_limit.a100", 4))
    assert config.tenants["vision"].lendable("a100") == 4


def test_autoscale_max_equal_to_nodes_is_fine() -> None:
    config = parse_config(mutate(base_config(), "policy.autoscale.a100.max_nodes", 2))
    assert config.policy.autoscale["a100"].max_nodes == 2


def test_prefix_is_prepended_to_keys() -> None:
    doc = mutate(base_config(), "tenants.vision.quota.a100", -1)
    with pytest.raises(SpecError) as info:
        parse_config(doc, prefix="quotas")
    assert info.value.key == "quotas.tenants.vision.quota.a100"


def test_non_string_names_are_rejected() -> None:
    with pytest.raises(SpecError) as info:
        parse_config({"flavors": {1: {"nodes": 1, "gpus_per_node": 1}}, "tenants": {}})
    assert info.value.key == "flavors.1"


def test_spec_error_str_is_key_colon_problem() -> None:
    err = SpecError("tenants.vision.quota.a100", "must be a non-negative integer")
    assert str(err) == "tenants.vision.quota.a100: must be a non-negative integer"
    assert isinstance(err, ValueError)


@pytest.mark.parametrize(
    ("path", "value", "key", "words"),
    [case[1:] for case in CONFIG_CASES],
    ids=[case[0] for case in CONFIG_CASES],
)
def test_invalid_config_names_the_key(path: str, value: Any, key: str, words: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_config(mutate(base_config(), path, value))
    assert info.value.key == key
    assert words in info.value.problem
    assert str(info.value) == f"{key}: {info.value.problem}"


def test_cohort_tree_is_parsed() -> None:
    doc = base_config()
    doc["cohorts"] = {
        "org": {"quota": {"a100": 2}},
        "research": {
            "parent": "org",
            "borrowing_limit": {"a100": 4},
            "lending_limit": {"a100": 1},
            "weight": 2,
        },
    }
    config = parse_config(doc)
    research = config.cohorts["research"]
    assert (research.parent, research.weight) == ("org", 2.0)
    assert dict(research.borrowing_limit) == {"a100": 4}
    assert dict(research.lending_limit) == {"a100": 1}
    assert dict(config.cohorts["org"].quota) == {"a100": 2}
    assert config.cohorts["org"].parent is None


def test_without_cohorts_a_tenants_cohort_is_flat() -> None:
    config = parse_config(base_config())
    assert config.cohorts == {}
    assert config.tenants["vision"].cohort == "research"


def test_every_policy_key_is_documented_in_scenario_md() -> None:
    """docs/SCENARIO.md's `policy:` block names every key the parser accepts (issue 45:
    `cull_warning` was found only by reading the source)."""
    from pathlib import Path

    from jupyter_gpuaas.admission.config import POLICY_KEYS

    doc = (Path(__file__).resolve().parents[1] / "docs" / "SCENARIO.md").read_text()
    block = doc.split("\npolicy:\n", 1)[1].split("\nuntil:", 1)[0]
    keys = {line.split(":")[0].strip() for line in block.splitlines() if line[2:3].isalpha()}
    assert set(POLICY_KEYS) <= keys
