"""The OpenAPI 3 document of the gateway's API, as a Python dict.

Tests validate real answers against these schemas (jsonschema), so the document cannot
drift from the code: `Request` forbids properties it does not list.
"""

from __future__ import annotations

from typing import Any

from jupyter_gpuaas import __version__
from jupyter_gpuaas.admission.model import KINDS, State

NUM = {"type": "number"}
NULLNUM = {"type": ["number", "null"]}
NULLSTR = {"type": ["string", "null"]}


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
        "properties": {"seconds": NULLNUM, "basis": {"type": "string"}},
        "additionalProperties": False,
    },
    "Grant": {
        "type": "object",
        "required": ["flavor", "node", "devices", "lease_expires"],
        "properties": {
            "flavor": {"type": "string"},
            "node": {"type": "string"},
            "devices": {"type": "array", "items": {"type": "integer", "minimum": 0}},
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
            "grant": _nullable("Grant"),
            "scaling": _nullable("Scaling"),
            "parked": {
                "type": "object",
                "properties": {"flavor": NULLSTR, "expires": NULLNUM},
            },
        },
        "additionalProperties": False,
    },
    "SubmitRequest": {
        "type": "object",
        "required": ["tenant", "kind", "gpus"],
        "properties": {
            "tenant": {"type": "string"},
            "kind": {"enum": list(KINDS)},
            "gpus": {"type": "integer", "minimum": 1},
            "flavor": NULLSTR,
            "priority": {"type": "integer"},
            "name": NULLSTR,
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
            "uuid": {"type": "string"},
            "memory_total": {"type": "integer"},
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


ERRORS = {
    "400": _resp("bad input", _ref("Error")),
    "401": _resp("no or bad token", _ref("Error")),
    "403": _resp("not allowed", _ref("Error")),
}
RID = [{"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}]


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
                "get": {"responses": {"200": _resp("nodes and devices", _ref("Devices"))}}
            },
            "/api/tenants": {
                "get": {"responses": {"200": _resp("tenants and usage", _ref("Tenants"))}}
            },
            "/api/tenants/{name}": {
                "put": {
                    "parameters": [
                        {
                            "name": "name",
                            "in": "path",
                            "required": True,
                            "schema": {"type": "string"},
                        }
                    ],
                    "requestBody": {"content": _json(_ref("TenantSpec"))},
                    "responses": {"200": _resp("the tenant", _ref("Tenant")), **ERRORS},
                }
            },
            "/api/requests": {
                "get": {
                    "parameters": [
                        {"name": n, "in": "query", "schema": {"type": "string"}}
                        for n in ("state", "tenant", "user", "kind", "limit")
                    ],
                    "responses": {
                        "200": _resp("requests", {"type": "array", "items": _ref("Request")}),
                        **ERRORS,
                    },
                },
                "post": {
                    "requestBody": {"content": _json(_ref("SubmitRequest"))},
                    "responses": {
                        "201": _resp("accepted (queued or admitted)", _ref("Request")),
                        "422": _resp("can never be admitted; stored as rejected", _ref("Error")),
                        **ERRORS,
                    },
                },
            },
            "/api/requests/{id}": {
                "get": {
                    "parameters": RID,
                    "responses": {
                        "200": _resp("the request", _ref("Request")),
                        "404": _resp("unknown", _ref("Error")),
                        **ERRORS,
                    },
                },
                "delete": {
                    "parameters": RID,
                    "responses": {
                        "200": _resp("cancelled or released", _ref("Request")),
                        "409": _resp("already ended", _ref("Error")),
                        **ERRORS,
                    },
                },
            },
            "/api/requests/{id}/heartbeat": {
                "post": {
                    "parameters": RID,
                    "requestBody": {"content": _json(_ref("Heartbeat"))},
                    "responses": {
                        "200": _resp("lease renewed", _ref("Request")),
                        "409": _resp("not admitted", _ref("Error")),
                        **ERRORS,
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
                    "responses": {
                        "200": {"description": "text/event-stream"},
                        "401": ERRORS["401"],
                        "403": ERRORS["403"],
                    },
                }
            },
            "/api/me": {"get": {"responses": {"200": _resp("the caller", _ref("Me"))}}},
            "/api/openapi.json": {
                "get": {"security": [], "responses": {"200": _resp("this document")}}
            },
            "/metrics": {
                "get": {
                    "description": "Prometheus text. Needs the view scope unless the "
                    "gateway runs with --metrics-public (then no token is needed).",
                    "security": [{"token": []}, {}],
                    "responses": {
                        "200": {"description": "Prometheus text"},
                        "401": ERRORS["401"],
                        "403": ERRORS["403"],
                    },
                }
            },
        },
    }
