"""The OpenAPI 3 document of the gateway's API, as a Python dict.

Tests validate real answers against these schemas (jsonschema), so the document cannot
drift from the code: `Request` forbids properties it does not list. The bounds of request
bodies and queries come from validate.py (the code's own constants), and every route
lists each status it answers (tests/gateway/test_edge.py checks both).
"""

from __future__ import annotations

from typing import Any

from jupyter_gpuaas._version import __version__
from jupyter_gpuaas.admission.model import KINDS, State

from .validate import INT32_MAX, NAME_MAX, NAME_RE, PRIORITY_MAX, PRIORITY_MIN, TEXT_MAX

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


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _nullable(name: str) -> dict[str, Any]:
    return {"oneOf": [{"type": "null"}, _ref(name)]}


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
                            "user": {"type": "string"},
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
        "description": "A tenant of the quota file's `tenants` block (SCENARIO.md).",
        "required": ["quota"],
        "properties": {
            "cohort": {"oneOf": [{"type": "null"}, NAME]},
            "quota": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}},
        },
    },
    "Health": {
        "type": "object",
        "required": ["status", "store", "leader"],
        "properties": {
            "status": {"enum": ["ok", "unavailable"]},
            "store": {"enum": ["ok", "unavailable", "locked"]},
            "leader": {"type": "boolean"},
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
        "503": "the store is unavailable (nothing was changed): retry after Retry-After",
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


def build_openapi(base_url: str = "/") -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "jupyter-gpuaas gateway",
            "version": __version__,
            "description": "Queue GPU servers, kernels and jobs against per-tenant quotas.",
        },
        "servers": [{"url": base_url}],
        "components": {
            "schemas": SCHEMAS,
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
                        **_errors("400", "409", "413"),
                    },
                }
            },
            "/api/requests": {
                "get": {
                    "parameters": [
                        {"name": "state", "in": "query", "schema": {"enum": STATES}},
                        {"name": "kind", "in": "query", "schema": {"enum": list(KINDS)}},
                        {"name": "tenant", "in": "query", "schema": {"type": "string"}},
                        {"name": "user", "in": "query", "schema": {"type": "string"}},
                        {
                            "name": "limit",
                            "in": "query",
                            "schema": {
                                "type": "integer",
                                "minimum": 1,
                                "maximum": 10000,
                                "default": 1000,
                            },
                        },
                        {
                            "name": "cursor",
                            "in": "query",
                            "description": "from the Link header of the previous page",
                            "schema": {"type": "string"},
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
                        "201": _resp("accepted (queued or admitted)", _ref("Request")),
                        **_errors("400", "413", "422"),
                    },
                },
            },
            "/api/requests/{id}": {
                "get": {
                    "parameters": RID,
                    "responses": {
                        "200": _resp("the request", _ref("Request")),
                        **_errors("404"),
                    },
                },
                "delete": {
                    "parameters": RID,
                    "responses": {
                        "200": _resp("cancelled or released", _ref("Request")),
                        **_errors("404", "409"),
                    },
                },
            },
            "/api/requests/{id}/heartbeat": {
                "post": {
                    "parameters": RID,
                    "requestBody": _body("Heartbeat"),
                    "responses": {
                        "200": _resp("lease renewed", _ref("Request")),
                        **_errors("400", "404", "409", "413"),
                    },
                }
            },
            "/api/events": {
                "get": {
                    "description": "Server-Sent Events; data is the decision's JSON plus "
                    "`request` (a Request) when it is about one.",
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
                "get": {"security": [], "responses": {"200": {"description": "Prometheus text"}}}
            },
        },
    }
