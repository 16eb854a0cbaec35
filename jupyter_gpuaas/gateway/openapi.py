"""The OpenAPI 3 document of the gateway's API, as a Python dict.

Tests validate real answers against these schemas (jsonschema), so the document cannot
drift from the code: `Request` forbids properties it does not list. The bounds of request
bodies and queries come from validate.py (the code's own constants), and every route
lists each status it answers (tests/gateway/test_edge.py checks both).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from jupyter_gpuaas._version import __version__
from jupyter_gpuaas.admission.model import (
    BORROW_WITHIN_COHORT,
    KINDS,
    QUEUEING,
    RECLAIM_WITHIN_COHORT,
    WITHIN_TENANT,
    State,
)

from .validate import (
    CURSOR_RE,
    INT32_MAX,
    LIMIT_DEFAULT,
    LIMIT_MAX,
    NAME_MAX,
    NAME_RE,
    PRIORITY_MAX,
    PRIORITY_MIN,
    QUERY_MAX,
    TEXT_MAX,
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


COUNTS = {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}}


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
            "seconds": {**NULLNUM, "description": "null: no estimate; `basis` says why"},
            "basis": {"type": "string", "description": "how it was estimated, or why not"},
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
            "weight": _or_null({"type": "number", "exclusiveMinimum": 0}),
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
            "idle_timeout": _or_null({"type": "number", "minimum": 0}),
            "reservation_ttl": _or_null({"type": "number", "minimum": 0}),
            "preemption_grace": _or_null({"type": "number", "minimum": 0}),
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


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _resp(desc: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"description": desc}
    if schema is not None:
        out["content"] = _json(schema)
    return out


RETRY_AFTER = {"Retry-After": {"description": "seconds to wait", "schema": {"type": "integer"}}}


def _errors(*codes: str) -> dict[str, Any]:
    """The error answers of a route: these codes plus 401, 403 and 503 (every route)."""
    what = {
        "400": "bad input (the sentence names the field)",
        "401": "no or bad token",
        "403": "not allowed",
        "404": "no such request",
        "409": "the request's state does not allow it",
        "413": "the body is larger than the limit (64 KiB by default)",
        "422": "valid, but can never be admitted; stored as rejected",
        "502": "a standby forwarded this change and the leader did not answer: it may or "
        "may not have been recorded (look before sending it again)",
        "503": "the store is unavailable, or this gateway is a standby and the leader "
        "decides (nothing was changed): retry after Retry-After",
    }
    out = {code: _resp(what[code], _ref("Error")) for code in (*codes, "401", "403", "503")}
    out["503"]["headers"] = RETRY_AFTER
    return out


def _body(name: str) -> dict[str, Any]:
    return {"required": True, "content": _json(_ref(name))}


RID = [{"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}]
LINK = {
    "Link": {
        "description": 'RFC 8288 `<…>; rel="next"` while more rows exist',
        "schema": {"type": "string"},
    }
}


# What a 201 from POST api/requests leads to (the fuzzer's stateful phase follows these).
_BY_ID = {"id": "$response.body#/id"}
SUBMIT_LINKS = {
    "GetRequest": {"operationId": "getRequest", "parameters": _BY_ID},
    "CancelRequest": {"operationId": "cancelRequest", "parameters": _BY_ID},
    "Heartbeat": {"operationId": "heartbeat", "parameters": _BY_ID},
}


def _schemas(flavors: Iterable[str] | None) -> dict[str, Any]:
    """The schemas; with this gateway's flavors, quota keys are those flavors."""
    if flavors is None:
        return SCHEMAS
    schemas = copy.deepcopy(SCHEMAS)
    props = schemas["TenantSpec"]["properties"]
    names = {"enum": sorted(flavors)}
    props["quota"]["propertyNames"] = names
    for key in ("borrowing_limit", "lending_limit"):
        props[key]["anyOf"][1]["propertyNames"] = names
    return schemas


def build_openapi(base_url: str = "/", flavors: Iterable[str] | None = None) -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "jupyter-gpuaas gateway",
            "version": __version__,
            "description": "Queue GPU servers, kernels and jobs against per-tenant quotas.",
        },
        "servers": [{"url": base_url}],
        "components": {
            "schemas": _schemas(flavors),
            "securitySchemes": {
                "token": {
                    "type": "apiKey",
                    "in": "header",
                    "name": "Authorization",
                    "description": "`token <T>` or `Bearer <T>`",
                }
            },
        },
        "security": [{"token": []}],
        "paths": {
            "/api/devices": {
                "get": {
                    "responses": {
                        "200": _resp("nodes and devices", _ref("Devices")),
                        **_errors(),
                    }
                }
            },
            "/api/tenants": {
                "get": {
                    "responses": {
                        "200": _resp("tenants and usage", _ref("Tenants")),
                        **_errors(),
                    }
                }
            },
            "/api/tenants/{name}": {
                "put": {
                    "parameters": [
                        {
                            "name": "name",
                            "in": "path",
                            "required": True,
                            "schema": NAME,
                        }
                    ],
                    "requestBody": _body("TenantSpec"),
                    "responses": {
                        "200": _resp("the tenant", _ref("Tenant")),
                        **_errors("400", "409", "413", "502"),
                    },
                }
            },
            "/api/requests": {
                "get": {
                    "parameters": [
                        {"name": "state", "in": "query", "schema": {"enum": STATES}},
                        {"name": "kind", "in": "query", "schema": {"enum": list(KINDS)}},
                        {"name": "tenant", "in": "query", "schema": QUERY},
                        {"name": "user", "in": "query", "schema": QUERY},
                        {
                            "name": "limit",
                            "in": "query",
                            "schema": {
                                "type": "integer",
                                "minimum": 1,
                                "maximum": LIMIT_MAX,
                                "default": LIMIT_DEFAULT,
                            },
                        },
                        {
                            "name": "cursor",
                            "in": "query",
                            "description": "from the Link header of the previous page: "
                            "`<created>_<id>` of the last row seen",
                            "schema": {"type": "string", "pattern": f"^{CURSOR_RE.pattern}$"},
                        },
                    ],
                    "responses": {
                        "200": {
                            **_resp(
                                "requests, newest first",
                                {"type": "array", "items": _ref("Request")},
                            ),
                            "headers": LINK,
                        },
                        **_errors("400"),
                    },
                },
                "post": {
                    "requestBody": _body("SubmitRequest"),
                    "responses": {
                        "201": {
                            **_resp("accepted (queued or admitted)", _ref("Request")),
                            "links": SUBMIT_LINKS,
                        },
                        **_errors("400", "413", "422", "502"),
                    },
                },
            },
            "/api/requests/{id}": {
                "get": {
                    "operationId": "getRequest",
                    "parameters": RID,
                    "responses": {
                        "200": _resp("the request", _ref("Request")),
                        **_errors("404"),
                    },
                },
                "delete": {
                    "operationId": "cancelRequest",
                    "parameters": RID,
                    "responses": {
                        "200": _resp("cancelled or released", _ref("Request")),
                        **_errors("404", "409", "502"),
                    },
                },
            },
            "/api/requests/{id}/heartbeat": {
                "post": {
                    "operationId": "heartbeat",
                    "parameters": RID,
                    "requestBody": _body("Heartbeat"),
                    "responses": {
                        "200": _resp("lease renewed", _ref("Request")),
                        **_errors("400", "404", "409", "413", "502"),
                    },
                }
            },
            "/api/events": {
                "get": {
                    "description": "Server-Sent Events; data is the decision's JSON plus "
                    "`request` (a Request) when it is about one. Every event has an `id:`; "
                    "the `: connected` comment carries the current one.",
                    "parameters": [
                        {
                            "name": "Last-Event-ID",
                            "in": "header",
                            "required": False,
                            "schema": {"type": "string"},
                            "description": "Resume after this event: the missed events "
                            "come first, or one `reset` event (relist the requests) when "
                            "the gateway no longer has them all.",
                        }
                    ],
                    "responses": {"200": {"description": "text/event-stream"}, **_errors()},
                }
            },
            "/api/me": {
                "get": {"responses": {"200": _resp("the caller", _ref("Me")), **_errors()}}
            },
            "/api/health": {
                "get": {
                    "security": [],
                    "description": "For load balancers and probes: no token needed.",
                    "responses": {
                        "200": _resp("the store answers", _ref("Health")),
                        "503": {
                            **_resp("the store is unreachable", _ref("Health")),
                            "headers": RETRY_AFTER,
                        },
                    },
                }
            },
            "/api/openapi.json": {
                "get": {"security": [], "responses": {"200": _resp("this document")}}
            },
            "/metrics": {
                "get": {
                    "description": "Prometheus text. Needs the view scope unless the "
                    "gateway runs with --metrics-public (then no token is needed).",
                    "security": [{"token": []}, {}],
                    "responses": {"200": {"description": "Prometheus text"}, **_errors()},
                }
            },
        },
    }
