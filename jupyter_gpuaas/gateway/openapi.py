"""The OpenAPI 3 document of the gateway's API, as a Python dict: its routes, their
parameters and every status each answers (tests/gateway/test_edge.py checks them).

The schemas of bodies and answers are in schemas.py; tests validate real answers against
them (jsonschema), so the document cannot drift from the code.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from jupyter_gpuaas._version import __version__
from jupyter_gpuaas.admission.model import KINDS

from .events import ID_MAX
from .schemas import NAME, QUERY, SCHEMAS, STATES, _ref
from .validate import CURSOR_RE, LIMIT_DEFAULT, LIMIT_MAX


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
        "415": "the body is not JSON: send Content-Type: application/json",
        "422": "valid, but can never be admitted; stored as rejected",
        "429": "the caller already has GatewayApp.max_queued_per_user requests queued",
        "502": "a standby forwarded this change and the leader did not answer: it may or "
        "may not have been recorded (look before sending it again)",
        "503": "the store is unavailable, this gateway is a standby and the leader "
        "decides, or the Hub is unreachable to check a token the gateway has not seen "
        "(nothing was changed): retry after Retry-After",
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
                        **_errors("400", "409", "413", "415", "502"),
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
                        **_errors("400", "413", "415", "422", "429", "502"),
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
                        **_errors("400", "404", "409", "413", "415", "502"),
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
                            "schema": {
                                "type": "string",
                                "maxLength": ID_MAX,
                                "pattern": "^[!-~]*$",
                            },
                            "description": "Resume after this event: the missed events "
                            "come first, or one `reset` event (relist the requests) when "
                            "the gateway no longer has them all (or never gave this id). "
                            "Longer, or not printable ASCII: 400.",
                        }
                    ],
                    "responses": {
                        "200": {"description": "text/event-stream"},
                        **_errors("400"),
                    },
                }
            },
            "/api/advice": {
                "get": {
                    "description": "Right-sizing advice from the gateway's own history, "
                    "each with its evidence (`jupyter-gpuaas advise`). An admin gets all of "
                    "it; anyone else, the advice about their own work. An answer is reused "
                    "for `GatewayApp.advice_cache_seconds`; a replay that runs past "
                    "`GatewayApp.advice_deadline` answers the last advice marked `stale`, "
                    "or 503 with Retry-After when there is none yet.",
                    "parameters": [
                        {
                            "name": "since",
                            "in": "query",
                            "description": "how far back: 30d, 12h, 90m or seconds",
                            "schema": {
                                "type": "string",
                                "pattern": "^[0-9]{1,6}(\\.[0-9]{1,3})?[smhdw]?$",
                                "default": "30d",
                            },
                        }
                    ],
                    "responses": {
                        "200": _resp("the advice", _ref("Advice")),
                        **_errors("400"),
                    },
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
