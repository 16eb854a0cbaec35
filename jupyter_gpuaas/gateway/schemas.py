"""The schemas of the gateway's OpenAPI document: what each body and answer holds.

openapi.py assembles the document (routes, statuses, links) from these. The bounds of
request bodies and queries come from validate.py (the code's own constants), and
`Request` forbids properties it does not list, so tests that validate real answers
against these schemas (jsonschema) catch any drift from the code.
"""

from __future__ import annotations

from typing import Any

from jupyter_gpuaas.admission.model import (
    BORROW_WITHIN_COHORT,
    KINDS,
    QUEUEING,
    RECLAIM_WITHIN_COHORT,
    WITHIN_TENANT,
    State,
)

from .validate import (
    COUNT_MAX,
    INT32_MAX,
    NAME_MAX,
    NAME_RE,
    PRIORITY_MAX,
    PRIORITY_MIN,
    QUERY_MAX,
    TENANT_SECONDS_MAX,
    TEXT_MAX,
    WEIGHT_MAX,
)

NUM = {"type": "number"}
NULLNUM = {"type": ["number", "null"]}
NULLSTR = {"type": ["string", "null"]}
# The one rule of tenant, cohort and flavor names (validate.py), and free text.
NAME = {"type": "string", "maxLength": NAME_MAX, "pattern": f"^{NAME_RE.pattern}$"}
TEXT = {
    "type": "string",
    "minLength": 1,
    "maxLength": TEXT_MAX,
    "pattern": "^[^\\x00-\\x1f\\x7f]*$",
}
STATES = [s.value for s in State]
# A free query filter (tenant, user): what `BaseHandler.query` accepts.
QUERY = {"type": "string", "maxLength": QUERY_MAX, "pattern": "^[^\\x00]*$"}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _nullable(name: str) -> dict[str, Any]:
    return {"oneOf": [{"type": "null"}, _ref(name)]}


def _or_null(schema: dict[str, Any]) -> dict[str, Any]:
    """An optional key of the quota format: null means "the default"."""
    return {"anyOf": [{"type": "null"}, schema]}


COUNTS = {
    "type": "object",
    "additionalProperties": {"type": "integer", "minimum": 0, "maximum": COUNT_MAX},
}


def _seconds(key: str) -> dict[str, Any]:
    """A duration of a tenant spec, with its ceiling (validate.py)."""
    return _or_null({"type": "number", "minimum": 0, "maximum": TENANT_SECONDS_MAX[key]})


SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["error", "field"],
        "properties": {
            "error": {"type": "string"},
            "field": NULLSTR,
            "id": {"type": "string", "description": "the stored (rejected) request, on 422"},
            "request": _ref("Request"),
        },
    },
    "Position": {
        "type": "object",
        "required": ["tenant", "tenant_of", "overall", "of"],
        "properties": {
            "tenant": {"type": "integer", "minimum": 1},
            "tenant_of": {"type": "integer", "minimum": 1},
            "overall": {"type": "integer", "minimum": 1},
            "of": {"type": "integer", "minimum": 1},
        },
        "additionalProperties": False,
    },
    "EstimatedWait": {
        "type": "object",
        "required": ["seconds", "basis"],
        "properties": {
            "seconds": {
                **NULLNUM,
                "description": "the middle estimate of a forward run of the queue, in seconds "
                "from now; null: no estimate, `basis` says why",
            },
            "low": {
                **NULLNUM,
                "description": "the range's low end (the quarter run; once enough past "
                "estimates have turned out, calibrated so that the range holds about two "
                "starts in three)",
            },
            "high": {
                **NULLNUM,
                "description": "the range's high end (the three-quarter run); null with "
                "`seconds` set: beyond what the estimate looks ahead",
            },
            "basis": {"type": "string", "description": "how it was estimated, or why not"},
            "confidence": {
                "enum": ["high", "medium", "low"],
                "description": "high: only known times (culls, declared durations); low: few "
                "past grants to go by",
            },
        },
        "additionalProperties": False,
    },
    "WaitingFor": {
        "type": "object",
        "required": ["kind", "message"],
        "properties": {
            "kind": {"enum": ["capacity", "quota", "fifo"]},
            "message": {"type": "string", "description": "why it waits, one sentence"},
        },
        "additionalProperties": False,
    },
    "Grant": {
        "type": "object",
        "required": ["flavor", "node", "devices", "lease_expires"],
        "properties": {
            "flavor": {"type": "string"},
            "node": {"type": "string"},
            "devices": {"type": "array", "items": {"type": "integer", "minimum": 0}},
            "uuids": {
                "type": ["array", "null"],
                "items": {"type": "string", "pattern": "^(GPU|MIG)-"},
                "description": "each device's UUID, in the order of `devices`; null where "
                "the devices have none (simulated). Launchers name these, not the indices.",
            },
            "lease_expires": NULLNUM,
            "admitted_at": NULLNUM,
            "busy": {"type": "boolean"},
            "utilization": NULLNUM,
        },
        "additionalProperties": False,
    },
    "Scaling": {
        "type": "object",
        "required": ["flavor", "nodes", "ready_by"],
        "properties": {
            "flavor": {"type": "string"},
            "nodes": {"type": "integer", "minimum": 1},
            "ready_by": NUM,
        },
        "additionalProperties": False,
    },
    "Request": {
        "type": "object",
        "required": ["id", "user", "tenant", "kind", "gpus", "flavor", "priority", "state"],
        "properties": {
            "id": {"type": "string"},
            "user": {"type": "string"},
            "tenant": {"type": "string"},
            "kind": {"enum": list(KINDS)},
            "gpus": {"type": "integer", "minimum": 1},
            "flavor": NULLSTR,
            "priority": {"type": "integer"},
            "name": NULLSTR,
            "state": {"enum": [s.value for s in State]},
            "created": NUM,
            "updated": NUM,
            "submit_time": NUM,
            "admitted_at": NULLNUM,
            "reason": NULLSTR,
            "position": _nullable("Position"),
            "estimated_wait": _nullable("EstimatedWait"),
            "waiting_for": _ref("WaitingFor"),
            "grant": _nullable("Grant"),
            "scaling": _nullable("Scaling"),
            "parked": {
                "type": "object",
                "properties": {"flavor": NULLSTR, "expires": NULLNUM},
            },
            # A warned preemption victim (preemption_grace): evicted at preempt_at.
            "preempt_at": NULLNUM,
            "preempted_by": NULLSTR,
            "preempt_reason": NULLSTR,
        },
        "additionalProperties": False,
    },
    "SubmitRequest": {
        "type": "object",
        "required": ["tenant", "kind", "gpus"],
        "properties": {
            "tenant": NAME,
            "kind": {"enum": list(KINDS)},
            "gpus": {
                "type": "integer",
                "minimum": 1,
                "maximum": INT32_MAX,
                "description": "more than the widest node has is 422 (can never be admitted)",
            },
            "flavor": {"oneOf": [{"type": "null"}, NAME]},
            "priority": {
                "type": ["integer", "null"],
                "minimum": PRIORITY_MIN,
                "maximum": PRIORITY_MAX,
                "description": "higher first; the range of a Kubernetes PriorityClass value",
            },
            "name": {"oneOf": [{"type": "null"}, TEXT]},
        },
        "additionalProperties": False,
    },
    "Heartbeat": {
        "type": "object",
        "required": ["busy"],
        "properties": {
            "busy": {"type": "boolean"},
            "utilization": {"type": "number", "minimum": 0, "maximum": 1},
            "uuids": {
                "type": "array",
                "maxItems": 64,
                "items": {"type": "string", "pattern": "^(GPU|MIG)-[A-Za-z0-9/-]{1,120}$"},
                "description": "the UUIDs of the GPUs the holder sees (Kubernetes: the device "
                "plugin's choice), for gpuaas_grant_info",
            },
        },
        "additionalProperties": False,
    },
    "Device": {
        "type": "object",
        "required": ["node", "index", "flavor", "holder"],
        "properties": {
            "node": {"type": "string"},
            "index": {"type": "integer"},
            "flavor": {"type": "string"},
            "model": {"type": "string"},
            "uuid": {"type": "string", "description": "GPU-… or MIG-…; empty if simulated"},
            "memory_total": {"type": "integer"},
            "mig_profile": {"type": "string", "description": "a MIG instance's, e.g. 1g.10gb"},
            "parent_uuid": {"type": "string", "description": "a MIG instance's GPU"},
            "utilization": NUM,
            "memory_used": {"type": "integer"},
            "temperature": NULLNUM,
            "power": NULLNUM,
            "healthy": {"type": "boolean"},
            "holder": {
                "oneOf": [
                    {"type": "null"},
                    {
                        "type": "object",
                        "required": ["id", "user", "tenant", "kind"],
                        "properties": {
                            "id": {"type": "string"},
                            "user": {
                                **NULLSTR,
                                "description": "null unless the caller holds it or has view",
                            },
                            "tenant": {"type": "string"},
                            "kind": {"type": "string"},
                        },
                    },
                ]
            },
        },
    },
    "Devices": {
        "type": "object",
        "required": ["simulated", "nodes", "devices"],
        "properties": {
            "simulated": {"type": "boolean"},
            "message": {"type": "string"},
            "nodes": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["name", "flavor", "gpus", "free"],
                    "properties": {
                        "name": {"type": "string"},
                        "flavor": {"type": "string"},
                        "gpus": {"type": "integer"},
                        "free": {"type": "integer"},
                        "autoscaled": {"type": "boolean"},
                    },
                },
            },
            "devices": {"type": "array", "items": _ref("Device")},
            "desired_nodes": {"type": "object", "additionalProperties": {"type": "integer"}},
        },
    },
    "Usage": {
        "type": "object",
        "required": ["flavor", "quota", "admitted", "parked", "borrowed", "pending_gpus"],
        "properties": {
            "flavor": {"type": "string"},
            "quota": {"type": "integer"},
            "admitted": {"type": "integer"},
            "parked": {"type": "integer"},
            "borrowed": {"type": "integer"},
            "borrowed_from": {"type": "array", "items": {"type": "string"}},
            "message": {"type": "string", "description": "the usage in one sentence"},
            "pending_gpus": {"type": "integer"},
            "pending_requests": {"type": "integer"},
        },
    },
    "Tenant": {
        "type": "object",
        "required": ["name", "quota", "usage"],
        "properties": {
            "name": {"type": "string"},
            "cohort": NULLSTR,
            "quota": {"type": "object", "additionalProperties": {"type": "integer"}},
            "borrowing_limit": {"type": "object"},
            "lending_limit": {"type": "object"},
            "weight": NUM,
            "queueing": {"type": "string"},
            "idle_timeout": NUM,
            "preemption_grace": {
                **NUM,
                "description": "seconds its servers and kernels keep running once warned",
            },
            "usage": {"type": "array", "items": _ref("Usage")},
            "simulated": {"type": "boolean"},
        },
    },
    "Tenants": {
        "type": "object",
        "required": ["simulated", "tenants"],
        "properties": {
            "simulated": {"type": "boolean"},
            "tenants": {"type": "array", "items": _ref("Tenant")},
        },
    },
    "TenantSpec": {
        "type": "object",
        "description": "A tenant of the quota file's `tenants` block (SCENARIO.md). Rules "
        "across fields (limits need a cohort and stay within the quota) are answered 400 "
        "with a sentence naming the key.",
        "required": ["quota"],
        "properties": {
            "cohort": _or_null(NAME),
            "quota": COUNTS,
            "borrowing_limit": _or_null(COUNTS),
            "lending_limit": _or_null(COUNTS),
            "weight": _or_null({"type": "number", "exclusiveMinimum": 0, "maximum": WEIGHT_MAX}),
            "queueing": _or_null({"enum": list(QUEUEING)}),
            "preemption": _or_null(
                {
                    "type": "object",
                    "properties": {
                        "within_tenant": _or_null({"enum": list(WITHIN_TENANT)}),
                        "reclaim_within_cohort": _or_null({"enum": list(RECLAIM_WITHIN_COHORT)}),
                        "borrow_within_cohort": _or_null({"enum": list(BORROW_WITHIN_COHORT)}),
                    },
                    "additionalProperties": False,
                }
            ),
            "idle_timeout": _seconds("idle_timeout"),
            "reservation_ttl": _seconds("reservation_ttl"),
            "preemption_grace": _seconds("preemption_grace"),
        },
        "additionalProperties": False,
    },
    "Health": {
        "type": "object",
        "required": ["status", "store", "leader"],
        "properties": {
            "status": {"enum": ["ok", "unavailable"]},
            "store": {"enum": ["ok", "unavailable", "locked"]},
            "leader": {
                "type": "boolean",
                "description": "false: a standby (leader.py), which answers reads only",
            },
            "leader_url": {**NULLSTR, "description": "a standby's leader, when known"},
        },
        "additionalProperties": False,
    },
    "Advice": {
        "type": "object",
        "required": ["advice", "since", "until", "requests", "min_grants"],
        "properties": {
            "advice": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["kind", "subject", "tenant", "flavor", "sentence", "evidence"],
                    "properties": {
                        "kind": {"enum": ["smaller_gpu", "move_quota"]},
                        "subject": {"type": "string"},
                        "tenant": {"type": "string"},
                        "flavor": {"type": "string"},
                        "sentence": {"type": "string"},
                        "evidence": {"type": "object"},
                    },
                },
            },
            "since": {"type": "number"},
            "until": {"type": "number"},
            "requests": {"type": "integer"},
            "min_grants": {"type": "integer"},
            "stale": {
                "type": "boolean",
                "description": "true: the last answer for this `since`, given because a "
                "new replay of the history ran past `GatewayApp.advice_deadline` (`until` "
                "says when it was worked out)",
            },
        },
    },
    "Me": {
        "type": "object",
        "required": ["name", "groups", "use", "view", "admin", "tenants"],
        "properties": {
            "name": {"type": "string"},
            "groups": {"type": "array", "items": {"type": "string"}},
            "use": {"type": "boolean"},
            "view": {"type": "boolean"},
            "admin": {"type": "boolean"},
            "tenants": {"type": "array", "items": {"type": "string"}},
        },
    },
}
