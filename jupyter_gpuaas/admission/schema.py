"""The scenario and quota format as a JSON Schema (the check every loader runs with it is
sim/schema_check.py's `check_schema`: jsonschema is no part of the pure core).

One format everywhere: a scenario (`jupyter-gpuaas simulate`) is the gateway's quota file
(`flavors`, `cohorts`, `tenants`, `policy`) plus the requests to replay. `parse_config`
(config.py) and the simulator's `parse_scenario` check every rule and name the key they
break; this schema says the same for editors and tools (the documentation publishes it as
scenario.schema.json, so a YAML editor completes and underlines the keys), and
`check_schema` holds every loaded file to it, so the published schema cannot be stricter
or looser than what the product accepts without a loader saying so.

Pure data: no file is read here (the schema is a literal). An explicit null counts as
absent everywhere (YAML's `key:`), as in the parsers.
"""

from __future__ import annotations

from typing import Any

from jupyter_gpuaas.admission.model import (
    BORROW_WITHIN_COHORT,
    KINDS,
    QUEUEING,
    RECLAIM_WITHIN_COHORT,
    WITHIN_TENANT,
)


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    kind = schema["type"]
    return {**schema, "type": [kind, "null"]}


def _count(description: str) -> dict[str, Any]:
    return _nullable({"type": "integer", "minimum": 0, "description": description})


def _seconds(description: str) -> dict[str, Any]:
    return _nullable({"type": "number", "minimum": 0, "description": description})


def _per_flavor(description: str) -> dict[str, Any]:
    return _nullable(
        {
            "type": "object",
            "description": description,
            "additionalProperties": {"type": "integer", "minimum": 0, "description": "GPUs"},
        }
    )


def _choice(values: tuple[str, ...], description: str) -> dict[str, Any]:
    return {"type": ["string", "null"], "enum": [*values, None], "description": description}


_WEIGHT = _nullable(
    {
        "type": "number",
        "exclusiveMinimum": 0,
        "description": "The share of fair sharing (policy.fair_sharing): a weight of 2 is "
        "entitled to twice the unused quota of a weight of 1. Default 1.",
    }
)

_FLAVOR = {
    "type": "object",
    "description": "A kind of GPU node.",
    "required": ["nodes", "gpus_per_node"],
    "additionalProperties": False,
    "properties": {
        "nodes": {"type": "integer", "minimum": 0, "description": "How many nodes."},
        "gpus_per_node": {"type": "integer", "minimum": 1, "description": "GPUs per node."},
    },
}

_COHORT = _nullable(
    {
        "type": "object",
        "description": "A cohort of a tree (Kueue's hierarchical cohorts).",
        "additionalProperties": False,
        "properties": {
            "parent": {
                "type": ["string", "null"],
                "minLength": 1,
                "description": "The cohort above; none for a root.",
            },
            "quota": _per_flavor("GPUs the cohort owns itself, shared by its subtree."),
            "borrowing_limit": _per_flavor(
                "At most this many GPUs the subtree borrows from its parent."
            ),
            "lending_limit": _per_flavor("At most this many GPUs the subtree lends to its parent."),
            "weight": _WEIGHT,
        },
    }
)

_PREEMPTION = _nullable(
    {
        "type": "object",
        "description": "Whom a request of this tenant may preempt (Kueue's preemption).",
        "additionalProperties": False,
        "properties": {
            "within_tenant": _choice(WITHIN_TENANT, "Requests of the same tenant. Default Never."),
            "reclaim_within_cohort": _choice(
                RECLAIM_WITHIN_COHORT,
                "Requests of other tenants that borrow this tenant's quota. Default Never.",
            ),
            "borrow_within_cohort": _choice(
                BORROW_WITHIN_COHORT,
                "Requests of other tenants, to borrow for a request over quota. Default Never.",
            ),
        },
    }
)

_TENANT = {
    "type": "object",
    "description": "A team with a GPU quota (Kueue's ClusterQueue).",
    "additionalProperties": False,
    "properties": {
        "cohort": {
            "type": ["string", "null"],
            "minLength": 1,
            "description": "The cohort whose members lend to and borrow from each other.",
        },
        "quota": _per_flavor("Nominal quota: GPUs per flavor the tenant is guaranteed."),
        "borrowing_limit": _per_flavor("At most this many GPUs borrowed from the cohort."),
        "lending_limit": _per_flavor("At most this many unused GPUs lent to the cohort."),
        "weight": _WEIGHT,
        "queueing": _choice(QUEUEING, "Order of the tenant's queue. Default BestEffortFIFO."),
        "preemption": _PREEMPTION,
        "idle_timeout": _seconds("Seconds idle before a grant is culled; overrides policy's."),
        "reservation_ttl": _seconds(
            "Seconds an admitted request's room is held for it to start; overrides policy's."
        ),
        "preemption_grace": _seconds(
            "Seconds a preempted server or kernel of this tenant keeps its GPUs after the "
            "warning; overrides policy's."
        ),
    },
}

_AUTOSCALE = {
    "type": "object",
    "description": "How one flavor's nodes scale.",
    "required": ["max_nodes"],
    "additionalProperties": False,
    "properties": {
        "max_nodes": {
            "type": "integer",
            "minimum": 0,
            "description": "At most this many nodes (at least the flavor's nodes).",
        },
        "provision_delay": _seconds("Seconds a new node takes to be ready (simulator)."),
        "scale_down_after": _seconds("Seconds an empty added node waits before it goes."),
        "provision": _nullable(
            {"type": "boolean", "description": "Whether the gateway asks for nodes."}
        ),
    },
}

_POLICY = _nullable(
    {
        "type": "object",
        "description": "Rules for every tenant.",
        "additionalProperties": False,
        "properties": {
            "fair_sharing": _nullable(
                {
                    "type": "boolean",
                    "description": "Share unused quota by weight (Kueue's fair sharing).",
                }
            ),
            "idle_timeout": _seconds("Seconds idle before a grant is culled; 0: never."),
            "reservation_ttl": _seconds(
                "Seconds an admitted request's room is held for it to start; 0: forever."
            ),
            "cull_warning": _seconds("Seconds of warning before an idle grant is culled."),
            "lease_ttl": _seconds(
                "Seconds without a lease renewal before a holder counts as gone."
            ),
            "preemption_grace": _seconds(
                "Seconds a preempted server or kernel keeps its GPUs after the warning; "
                "a job is preempted at once."
            ),
            "one_head_per_cycle": _nullable(
                {
                    "type": "boolean",
                    "description": "Admit at most one request per tenant per admission "
                    "cycle, as Kueue's scheduler does.",
                }
            ),
            "autoscale": _nullable(
                {
                    "type": "object",
                    "description": "Per flavor: how its nodes scale.",
                    "additionalProperties": _AUTOSCALE,
                }
            ),
        },
    }
)

_REQUEST = {
    "type": "object",
    "description": "One request to replay (times in seconds from the clock's start).",
    "required": ["id", "tenant", "user", "kind", "gpus", "submit", "duration"],
    "additionalProperties": False,
    "properties": {
        "id": {"type": ["string", "integer"], "description": "Unique in the scenario."},
        "tenant": {"type": "string", "minLength": 1, "description": "Who pays."},
        "user": {"type": "string", "minLength": 1, "description": "Who asks."},
        "kind": {"type": "string", "enum": list(KINDS), "description": "What starts."},
        "gpus": {"type": "integer", "minimum": 1, "description": "GPUs asked for."},
        "flavor": {
            "type": ["string", "null"],
            "minLength": 1,
            "description": "The flavor asked for; none: any the tenant has quota of.",
        },
        "priority": {"type": ["integer", "null"], "description": "Higher goes first. Default 0."},
        "submit": {"type": "number", "minimum": 0, "description": "When it is submitted."},
        "duration": {
            "type": "number",
            "minimum": 0,
            "description": "How long it runs once admitted.",
        },
        "busy": {
            "type": ["array", "null"],
            "description": "[start, end] intervals of GPU use, from its admission, sorted; "
            "none: busy all the time.",
            "items": {
                "type": "array",
                "minItems": 2,
                "maxItems": 2,
                "items": {"type": "number", "minimum": 0},
            },
        },
        "cancel": _seconds("When its user cancels it, if ever."),
    },
}

QUOTAS_PROPERTIES: dict[str, Any] = {
    "flavors": {
        "type": "object",
        "description": "The kinds of GPU node, by name.",
        "additionalProperties": _FLAVOR,
    },
    "cohorts": _nullable(
        {
            "type": "object",
            "description": "A tree of cohorts, by name (optional).",
            "additionalProperties": _COHORT,
        }
    ),
    "tenants": {
        "type": "object",
        "description": "The teams, by name.",
        "additionalProperties": _TENANT,
    },
    "policy": _POLICY,
}

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "jupyter-gpuaas scenario",
    "description": "A scenario for `jupyter-gpuaas simulate`: GPU flavors, tenants with "
    "quotas, a policy, and the requests to replay (a list, or a CSV file with the same "
    "columns). The gateway's quota file is the same document without the requests.",
    "type": "object",
    "required": ["flavors", "tenants"],
    "additionalProperties": False,
    "properties": {
        **QUOTAS_PROPERTIES,
        "until": _seconds("Stop the virtual clock here."),
        "requests": {
            "type": ["array", "null"],
            "description": "The requests (or requests_file, not both).",
            "items": _REQUEST,
        },
        "requests_file": {
            "type": "string",
            "minLength": 1,
            "description": "A CSV file of requests (its first row names the columns), "
            "relative to the scenario.",
        },
        "expect": _nullable(
            {"type": "object", "description": "What the run must show (tests/scenarios)."}
        ),
    },
}

# The gateway's quota file: the same blocks, nothing else.
QUOTAS_SCHEMA: dict[str, Any] = {
    **SCHEMA,
    "title": "jupyter-gpuaas quota file",
    "properties": QUOTAS_PROPERTIES,
}
