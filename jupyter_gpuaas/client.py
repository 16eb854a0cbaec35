"""The one HTTP client of the gateway: everything outside it (spawner, kernel provisioner,
magics, widgets, CLI) talks to the gateway only through this module.

`GatewayClient` is async (tornado's AsyncHTTPClient, for code running on an event loop)
and holds every call once: its path, its retries, the type of its answer (`RequestObject`,
with its `GrantObject`). `SyncGatewayClient` is its blocking face (the CLI, scripts): the
same methods, each running GatewayClient's on a private event loop thread. Both raise
`GatewayError(status, error, field)` on a 4xx/5xx answer (status 0: no answer).

`from_env()` finds the gateway: GPUAAS_URL and GPUAAS_TOKEN, else (inside JupyterHub,
through its proxy) `<public origin><base_url>services/gpuaas/` from
JUPYTERHUB_PUBLIC_HUB_URL and JUPYTERHUB_API_TOKEN. The Hub's spawner sets GPUAAS_URL for
every server (hub/gateway_url.py), so the public URL is needed only without it.

HTTPS: under JupyterHub's internal SSL (`c.JupyterHub.internal_ssl = True`) every server
and service gets JUPYTERHUB_SSL_KEYFILE, JUPYTERHUB_SSL_CERTFILE and
JUPYTERHUB_SSL_CLIENT_CA. A client of an https gateway then presents that certificate and
trusts that CA (and the system's), for its calls and its event stream alike; the context
is built once per set of files (`ssl_context`). Callers outside such an environment (the
Hub's spawner, with the Hub's own certificate) pass `ssl_context=` themselves.
"""

from __future__ import annotations

import asyncio
import builtins
import functools
import json
import os
import ssl
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from typing import Any, Concatenate, ParamSpec, TypedDict, TypeVar, cast
from urllib.parse import urlencode, urlparse

from jupyter_gpuaas.words import about_field

__all__ = [
    "NO_DEVICES",
    "GatewayClient",
    "GatewayError",
    "GrantObject",
    "RequestObject",
    "SyncGatewayClient",
    "gateway_from_env",
    "grant_names",
    "launch_environment",
    "ssl_context",
    "ssl_context_from_env",
]

SERVICE_PREFIX = "/services/gpuaas/"


class GatewayError(Exception):
    """An error answer of the gateway (or no answer: status 0)."""

    def __init__(self, status: int, error: str, field: str | None = None, body: Any = None):
        super().__init__(status, error, field)
        self.status = status
        self.error = error
        self.field = field
        self.body = body
        self.retry_after: float | None = None  # the answer's Retry-After, in seconds

    def __str__(self) -> str:
        """One sentence a person reads: the gateway's own words, naming the field. A
        refusal (4xx) is just that sentence; a failure of the gateway says so."""
        text = about_field(self.field, self.error)
        if self.status >= 500:
            return f"the GPU gateway failed ({self.status}): {text}"
        return text


def gateway_from_env(env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(url, token) of the gateway from the environment; raises GatewayError saying how to
    configure when nothing is set."""
    env = os.environ if env is None else env
    token = env.get("GPUAAS_TOKEN") or env.get("JUPYTERHUB_API_TOKEN") or ""
    url = env.get("GPUAAS_URL") or _through_the_proxy(env)
    if not url:
        raise GatewayError(
            0,
            "cannot find the gpuaas gateway: set GPUAAS_URL (e.g. http://127.0.0.1:8765/) "
            "and GPUAAS_TOKEN, or run inside JupyterHub (its spawner sets GPUAAS_URL, and "
            "a Hub with c.JupyterHub.public_url sets JUPYTERHUB_PUBLIC_HUB_URL)",
        )
    if not token:
        raise GatewayError(0, f"no token for the gateway at {url}: set GPUAAS_TOKEN")
    return url.rstrip("/") + "/", token


def _through_the_proxy(env: Mapping[str, str]) -> str:
    """`<public origin><base_url>services/gpuaas/` when JupyterHub told us its public URL
    (JUPYTERHUB_PUBLIC_HUB_URL, JUPYTERHUB_PUBLIC_URL: set, possibly empty, since
    JupyterHub 4.1). Never JUPYTERHUB_API_URL's origin: that is the Hub's own port, which
    answers `/services/...` with a redirect, not the gateway."""
    public = env.get("JUPYTERHUB_PUBLIC_HUB_URL") or env.get("JUPYTERHUB_PUBLIC_URL")
    if not public:
        return ""
    origin = urlparse(public)
    base = env.get("JUPYTERHUB_BASE_URL") or "/"
    return f"{origin.scheme}://{origin.netloc}{base.rstrip('/')}{SERVICE_PREFIX}"


@functools.lru_cache(maxsize=8)
def ssl_context(keyfile: str | None, certfile: str | None, cafile: str | None) -> ssl.SSLContext:
    """A client context for an https gateway, built once per set of files.

    As JupyterHub's own `make_ssl_context` for internal SSL: the server's certificate is
    verified (against `cafile` and the system's CAs) with its host name, and the client
    presents `certfile`/`keyfile` when given (internal SSL asks every client for one).
    """
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cafile or None)
    if certfile:
        context.load_cert_chain(certfile, keyfile or None)
    return context


def ssl_context_from_env(env: Mapping[str, str] | None = None) -> ssl.SSLContext | None:
    """The context of JUPYTERHUB_SSL_{KEYFILE,CERTFILE,CLIENT_CA}; None when none is set
    (the system's CAs then verify an https gateway)."""
    env = os.environ if env is None else env
    files = [env.get(f"JUPYTERHUB_SSL_{k}") or None for k in ("KEYFILE", "CERTFILE", "CLIENT_CA")]
    if not any(files):
        return None
    try:
        return ssl_context(*files)
    except (OSError, ssl.SSLError) as e:
        raise GatewayError(
            0,
            "cannot use JupyterHub's internal SSL files (JUPYTERHUB_SSL_KEYFILE, "
            f"JUPYTERHUB_SSL_CERTFILE, JUPYTERHUB_SSL_CLIENT_CA): {e}",
        ) from None


#: The environment of a process that holds no grant and must see no device (CUDA's and the
#: NVIDIA container runtime's words for "none"): a caller's policy, see launch_environment.
NO_DEVICES: Mapping[str, str] = {"CUDA_VISIBLE_DEVICES": "", "NVIDIA_VISIBLE_DEVICES": "void"}


def launch_environment(grant: Mapping[str, Any] | None) -> dict[str, str]:
    """The environment that confines a process to its granted devices: the one mapping
    of a grant that the spawner, the kernel provisioner and the job runner all use.

    `grant` is a request object of the gateway (an answer or an event): its `id`,
    `tenant` and `grant` (`node`, `flavor`, `devices`, `uuids`). Without a grant the
    answer is {}: whether to hide every device then (`NO_DEVICES`) is the caller's policy.

    `CUDA_VISIBLE_DEVICES` (what CUDA, and so PyTorch, JAX and TensorFlow obey) and
    `NVIDIA_VISIBLE_DEVICES` (what the NVIDIA container runtime reads) both name the
    devices by UUID (`GPU-…`, `MIG-…`) wherever the grant has UUIDs: a grant's indices are
    positions within its node, which on a host with several GPU models (one node per
    model) are not the host's device numbers. Only simulated devices have no UUIDs; their
    indices are named instead. `CUDA_DEVICE_ORDER=PCI_BUS_ID` makes CUDA number devices
    in the order NVML (and nvidia-smi) lists them, rather than fastest first.
    """
    inner = (grant or {}).get("grant")
    if not grant or not isinstance(inner, Mapping):
        return {}
    devices = [str(d) for d in inner.get("devices") or []]
    uuids = inner.get("uuids")
    names = devices
    if (
        isinstance(uuids, list)
        and len(uuids) == len(devices)
        and all(isinstance(u, str) and u.startswith(("GPU-", "MIG-")) for u in uuids)
    ):
        names = [str(u) for u in uuids]
    visible = ",".join(names)
    env = {
        "CUDA_VISIBLE_DEVICES": visible,
        "NVIDIA_VISIBLE_DEVICES": visible or "void",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }
    env.update((name, value) for name, value in grant_names(grant).items() if value)
    return env


def grant_names(request: Mapping[str, Any]) -> dict[str, str]:
    """`GPUAAS_{REQUEST_ID,TENANT,FLAVOR,NODE}` of a request ("" where unknown): what a
    grant is, for the process that holds it. Part of `launch_environment`; alone inside a
    pod, where the device plugin, not the gateway, chooses the devices."""
    inner = request.get("grant") or {}
    return {
        "GPUAAS_REQUEST_ID": str(request.get("id") or ""),
        "GPUAAS_TENANT": str(request.get("tenant") or ""),
        "GPUAAS_FLAVOR": str(inner.get("flavor") or request.get("flavor") or ""),
        "GPUAAS_NODE": str(inner.get("node") or ""),
    }


# The API's objects as a client reads them (the gateway's schemas.py: `Grant`, `Request`):
# JSON objects, so a caller indexes them as before, and mypy knows their keys.


class _GrantKeys(TypedDict):
    flavor: str
    node: str
    devices: builtins.list[int]
    lease_expires: float | None


class GrantObject(_GrantKeys, total=False):
    """Where an admitted request's GPUs are: its node, the devices' indices on it and,
    for real devices, their UUIDs (`launch_environment` turns this into an environment)."""

    uuids: builtins.list[str] | None
    admitted_at: float | None
    busy: bool
    utilization: float | None


class PositionObject(TypedDict):
    """A queued request's place: in its tenant's queue and overall (1 = next)."""

    tenant: int
    tenant_of: int
    overall: int
    of: int


class EstimatedWait(TypedDict):
    seconds: float | None  # None: no estimate; `basis` says why
    basis: str


class WaitingFor(TypedDict):
    kind: str  # capacity, quota or fifo
    message: str


class _RequestKeys(TypedDict):
    id: str
    user: str
    tenant: str
    kind: str
    gpus: int
    flavor: str | None
    priority: int
    state: str


class RequestObject(_RequestKeys, total=False):
    """A request as the gateway answers it (submit, get, list, cancel, heartbeat) and
    as its events carry it: `grant` while admitted, `position` while queued."""

    name: str | None
    created: float
    updated: float
    submit_time: float
    admitted_at: float | None
    reason: str | None
    position: PositionObject | None
    estimated_wait: EstimatedWait | None
    waiting_for: WaitingFor
    grant: GrantObject | None
    scaling: dict[str, Any] | None
    parked: dict[str, Any]
    preempt_at: float | None
    preempted_by: str | None
    preempt_reason: str | None


def _submit_body(
    tenant: str,
    kind: str,
    gpus: int,
    flavor: str | None,
    priority: int,
    name: str | None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"tenant": tenant, "kind": kind, "gpus": gpus, "priority": priority}
    if flavor is not None:
        body["flavor"] = flavor
    if name is not None:
        body["name"] = name
    return body


# A submission is retried (with the same Idempotency-Key, so it is never made twice) when
# its answer was ambiguous or a refusal that says try again: no answer at all (0), the
# leader did not answer a standby (502), the store did not record it (503).
RETRY_STATUSES = (0, 502, 503)
SUBMIT_ATTEMPTS = 4
RETRY_PAUSE_MAX = 5.0


def new_idempotency_key() -> str:
    return uuid.uuid4().hex


def _retry_pause(error: GatewayError, attempt: int) -> float:
    """Seconds before the next try: the gateway's Retry-After when it said, else 1, 2, 4."""
    after = error.retry_after
    pause = after if after is not None else float(2**attempt)
    return min(RETRY_PAUSE_MAX, max(0.1, pause))


def _error_from(status: int, raw: bytes, retry_after: str | None = None) -> GatewayError:
    error = _parse_error(status, raw)
    try:
        error.retry_after = float(retry_after) if retry_after is not None else None
    except ValueError:
        error.retry_after = None
    return error


def _parse_error(status: int, raw: bytes) -> GatewayError:
    try:
        body = json.loads(raw)
        return GatewayError(status, str(body.get("error")), body.get("field"), body)
    except (ValueError, AttributeError):
        text = raw.decode("utf-8", "replace").strip()[:200] or "no body"
        return GatewayError(status, text)


C = TypeVar("C", bound="_Base")


class _Base:
    """Where the gateway is and how to talk to it: shared by both faces of the client."""

    def __init__(
        self,
        url: str,
        token: str,
        timeout: float = 30.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.url = url.rstrip("/") + "/"
        self.token = token
        self.timeout = timeout
        self._ssl_context = ssl_context

    @property
    def ssl(self) -> ssl.SSLContext | None:
        """The context for an https gateway: the one given, else internal SSL's (env)."""
        if not self.url.startswith("https:"):
            return None
        if self._ssl_context is None:
            self._ssl_context = ssl_context_from_env()
        return self._ssl_context

    @classmethod
    def from_env(cls: type[C], env: Mapping[str, str] | None = None, **kwargs: Any) -> C:
        url, token = gateway_from_env(env)
        return cls(url, token, **kwargs)

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self.token}", "Content-Type": "application/json"}

    def _url(self, path: str, query: Mapping[str, Any] | None = None) -> str:
        url = self.url + path.lstrip("/")
        if query:
            q = {k: v for k, v in query.items() if v is not None}
            if q:
                url += "?" + urlencode(q)
        return url


class GatewayClient(_Base):
    """The client (tornado's AsyncHTTPClient): every call of the API, its retries and its
    answers' types are here once. `events()` iterates the SSE stream."""

    async def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        from tornado.httpclient import AsyncHTTPClient, HTTPClientError

        try:
            resp = await AsyncHTTPClient().fetch(
                self._url(path, query),
                method=method,
                headers={**self._headers(), **(headers or {})},
                body=None if body is None else json.dumps(body),
                allow_nonstandard_methods=True,
                request_timeout=self.timeout,
                ssl_options=self.ssl,
            )
        except HTTPClientError as e:
            if e.response is not None and e.code != 599:
                after = e.response.headers.get("Retry-After")
                raise _error_from(e.code, e.response.body or b"", after) from None
            raise GatewayError(0, f"cannot reach the gateway at {self.url}: {e}") from None
        except OSError as e:
            raise GatewayError(0, f"cannot reach the gateway at {self.url}: {e}") from None
        return json.loads(resp.body) if resp.body else None

    async def me(self) -> dict[str, Any]:
        return cast("dict[str, Any]", await self._call("GET", "api/me"))

    async def devices(self) -> dict[str, Any]:
        return cast("dict[str, Any]", await self._call("GET", "api/devices"))

    async def tenants(self) -> dict[str, Any]:
        return cast("dict[str, Any]", await self._call("GET", "api/tenants"))

    async def put_tenant(self, name: str, spec: Mapping[str, Any]) -> dict[str, Any]:
        return cast("dict[str, Any]", await self._call("PUT", f"api/tenants/{name}", dict(spec)))

    async def submit(
        self,
        tenant: str,
        kind: str,
        gpus: int,
        flavor: str | None = None,
        priority: int = 0,
        name: str | None = None,
        idempotency_key: str | None = None,
    ) -> RequestObject:
        """Submit. Sent with an Idempotency-Key (`idempotency_key`, else a new one) and
        retried with it after an ambiguous answer, so a retry never makes a second request."""
        body = _submit_body(tenant, kind, gpus, flavor, priority, name)
        key = idempotency_key or new_idempotency_key()
        for attempt in range(SUBMIT_ATTEMPTS):
            try:
                answer = await self._call(
                    "POST", "api/requests", body, headers={"Idempotency-Key": key}
                )
                return cast(RequestObject, answer)
            except GatewayError as e:
                if e.status not in RETRY_STATUSES or attempt == SUBMIT_ATTEMPTS - 1:
                    raise
                await asyncio.sleep(_retry_pause(e, attempt))
        raise AssertionError("unreachable")

    async def get(self, rid: str) -> RequestObject:
        return cast(RequestObject, await self._call("GET", f"api/requests/{rid}"))

    async def list(self, /, **filters: Any) -> builtins.list[RequestObject]:
        return cast(
            "builtins.list[RequestObject]", await self._call("GET", "api/requests", query=filters)
        )

    async def cancel(self, rid: str) -> RequestObject:
        return cast(RequestObject, await self._call("DELETE", f"api/requests/{rid}"))

    async def heartbeat(
        self,
        rid: str,
        busy: bool,
        utilization: float | None = None,
        uuids: builtins.list[str] | None = None,
    ) -> RequestObject:
        body: dict[str, Any] = {"busy": busy}
        if utilization is not None:
            body["utilization"] = utilization
        if uuids:  # the GPUs this holder sees (gpuaas_grant_info in Kubernetes mode)
            body["uuids"] = uuids
        return cast(RequestObject, await self._call("POST", f"api/requests/{rid}/heartbeat", body))

    async def events(
        self, *, comments: bool = False, last_event_id: str | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """Yield `{"event": name, "data": {...}, "id": id}` per SSE event (and
        `{"comment": text}`, with the stream's current `id` on `connected`, when
        `comments`). Ends when the server closes the stream. `last_event_id` resumes: the
        gateway first sends what happened after that event, or a `reset` event.

        A plain HTTP/1.0 request on an asyncio connection, so that a consumer who stops
        iterating closes the connection at once (tornado's client cannot be hung up on
        without raising into its own callbacks), and the body arrives unchunked.
        """
        url = urlparse(self._url("api/events"))
        secure = url.scheme == "https"
        port = url.port or (443 if secure else 80)
        context = (self.ssl or ssl.create_default_context()) if secure else None
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(url.hostname, port, ssl=context), self.timeout
            )
        except (OSError, asyncio.TimeoutError) as e:
            raise GatewayError(0, f"cannot reach the gateway at {self.url}: {e}") from None
        try:
            target = url.path + (f"?{url.query}" if url.query else "")
            head = [f"GET {target} HTTP/1.0", f"Host: {url.netloc}", "Accept: text/event-stream"]
            head += [f"{k}: {v}" for k, v in self._headers().items()]
            if last_event_id:
                head.append(f"Last-Event-ID: {last_event_id}")
            writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
            status_line = await reader.readline()
            try:
                status = int(status_line.split()[1])
            except (IndexError, ValueError):
                raise GatewayError(0, f"not an HTTP answer: {status_line[:80]!r}") from None
            while (await reader.readline()).strip():
                pass  # response headers
            if status >= 400:
                raise _error_from(status, await reader.read())
            block: list[str] = []
            while True:
                raw = await reader.readline()
                if not raw:
                    return
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                if line:
                    block.append(line)
                    continue
                parsed = _parse_sse("\n".join(block)) if block else None
                block = []
                if parsed is not None and (comments or "comment" not in parsed):
                    yield parsed
        finally:
            writer.close()


# The blocking face. Each of its methods is GatewayClient's, awaited on one event loop that
# runs in a daemon thread of this process: one implementation of every call (its retries
# and Idempotency-Key included), and a caller needs no loop of its own, nor must it be
# outside one (a notebook's kernel runs one).

P = ParamSpec("P")
R = TypeVar("R")


class _LoopThread:
    """The blocking face's event loop, started on first use (and again in a forked child,
    which inherits no thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = 0

    def _running(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._pid != os.getpid():
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="gpuaas-client")
                thread.daemon = True
                thread.start()
                self._loop, self._pid = loop, os.getpid()
            return self._loop

    def run(self, call: Coroutine[Any, Any, R]) -> R:
        future = asyncio.run_coroutine_threadsafe(call, self._running())
        try:
            return future.result()
        except BaseException:
            future.cancel()  # an interrupted caller (Ctrl-C) leaves no call running
            raise


_LOOP = _LoopThread()


def _blocking(
    method: Callable[Concatenate[GatewayClient, P], Coroutine[Any, Any, R]],
) -> Callable[Concatenate[SyncGatewayClient, P], R]:
    """GatewayClient's `method` as a method of SyncGatewayClient that blocks for its answer."""

    @functools.wraps(method)
    def blocking(self: SyncGatewayClient, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return _LOOP.run(method(self.client, *args, **kwargs))

    return blocking


class SyncGatewayClient(_Base):
    """GatewayClient for callers without an event loop (the CLI, scripts): the same
    methods, each blocking until its answer."""

    @property
    def client(self) -> GatewayClient:
        """The async client whose calls these are (for `events()`, say, on a loop of one's
        own)."""
        return GatewayClient(self.url, self.token, self.timeout, self._ssl_context)

    me = _blocking(GatewayClient.me)
    devices = _blocking(GatewayClient.devices)
    tenants = _blocking(GatewayClient.tenants)
    put_tenant = _blocking(GatewayClient.put_tenant)
    submit = _blocking(GatewayClient.submit)
    get = _blocking(GatewayClient.get)
    list = _blocking(GatewayClient.list)
    cancel = _blocking(GatewayClient.cancel)
    heartbeat = _blocking(GatewayClient.heartbeat)


def _parse_sse(block: str) -> dict[str, Any] | None:
    name, data, comment, event_id = "message", [], [], None
    for line in block.splitlines():
        if line.startswith(":"):
            comment.append(line[1:].strip())
        elif line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
        elif line.startswith("id:"):
            event_id = line[3:].strip()
    out: dict[str, Any] = {"id": event_id} if event_id else {}
    if data:
        return {"event": name, "data": json.loads("\n".join(data)), **out}
    if comment or out:  # a comment, or an id alone (it moves the stream's last id)
        return {"comment": " ".join(comment), **out}
    return None
