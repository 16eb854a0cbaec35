"""How every part of jupyter-gpuaas reaches the API server: the client (the pod's service
account inside a cluster, else the kubeconfig), how long one call may stall, the namespace
a pod runs in, and a watch that survives whatever ends it (its timeout, a restart, an
expired resourceVersion, a refused call, a lost connection).

One place for each, so the gateway's inventory, its Kueue engine, its scale-up objects,
the kernel provisioner and the job runner connect, default and resume the same way."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

log = logging.getLogger("jupyter_gpuaas.kubeapi")

#: Where Kubernetes mounts a pod's service account (its token and namespace).
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"

#: Seconds a call may wait to connect, and then for each next piece of its answer. An API
#: server that stops answering (frozen, its etcd hung, a half-open connection) fails the
#: call after this instead of stalling its loop for good; the loop says so and asks again.
#: Each piece, not the whole: a list of 15,000 Workloads may take longer than this in all.
REQUEST_TIMEOUT = 30.0

Change = TypeVar("Change")


def request_timeout(query: Iterable[tuple[str, Any]] | None, seconds: float) -> Any:
    """The aiohttp timeout of one call with these query parameters. A watch is quiet for
    as long as nothing changes, until the server ends it at its `timeoutSeconds`: it may
    wait that long and `seconds` more for its next event. A followed log is quiet for as
    long as its job prints nothing: only its connection is bounded."""
    from aiohttp import ClientTimeout

    params = dict(query or ())
    if params.get("follow") is True:
        return ClientTimeout(sock_connect=seconds)
    if params.get("watch") is True:
        ends = params.get("timeoutSeconds")
        return ClientTimeout(
            sock_connect=seconds, sock_read=None if ends is None else float(ends) + seconds
        )
    return ClientTimeout(sock_connect=seconds, sock_read=seconds)


async def api_client(timeout: float = REQUEST_TIMEOUT) -> Any:
    """A kubernetes_asyncio ApiClient: the in-cluster config where this process runs in a
    pod with a service account, else the kubeconfig ($KUBECONFIG or ~/.kube/config).

    Each call it makes is bounded by `timeout` (`request_timeout`) unless the caller gives
    its own `_request_timeout`: kubernetes_asyncio's own default is no limit at all, so one
    call to a frozen API server would hold the inventory, Kueue mode's loops or a kernel's
    launch forever."""
    from kubernetes_asyncio import client, config

    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        # $KUBECONFIG as it is now: kubernetes_asyncio reads it once, when first imported.
        await config.load_kube_config(config_file=os.environ.get("KUBECONFIG") or None)

    class BoundedClient(client.ApiClient):
        def request(self, *args: Any, **kwargs: Any) -> Any:
            if kwargs.get("_request_timeout") is None:
                query = kwargs.get("query_params", args[2] if len(args) > 2 else None)
                kwargs["_request_timeout"] = request_timeout(query, timeout)
            return super().request(*args, **kwargs)

    return BoundedClient()


def own_namespace(otherwise: str = "default") -> str:
    """The namespace of the pod this process runs in, or `otherwise` outside a cluster."""
    try:
        with open(f"{SERVICE_ACCOUNT_DIR}/namespace", encoding="utf-8") as f:
            return f.read().strip() or otherwise
    except OSError:
        return otherwise


async def resumable_watch(
    what: str,
    list_call: Callable[..., Any],
    *args: Any,
    version: Callable[[], str],
    apply: Callable[[str, Mapping[str, Any]], Iterable[Change]],
    relist: Callable[[], Awaitable[Iterable[Change]]],
    timeout_seconds: int,
    max_backoff: float,
    **kwargs: Any,
) -> AsyncIterator[Change]:
    """The changes a watch of `list_call(*args, **kwargs)` brings, from `version()` on, for
    as long as the caller iterates. `apply` turns one event into changes (and moves the
    version); when the server no longer keeps our version (410 Gone), `relist` lists again
    and returns what changed in the gap. A refused call (RBAC, a server error) or a lost
    connection is logged and retried with a doubling delay up to `max_backoff`; `what`
    names the objects in those lines."""
    from aiohttp import ClientError
    from kubernetes_asyncio import watch
    from kubernetes_asyncio.client.exceptions import ApiException

    delay = 0.5
    while True:
        w = watch.Watch()
        try:
            stream = w.stream(
                list_call,
                *args,
                resource_version=version(),
                timeout_seconds=timeout_seconds,
                allow_watch_bookmarks=True,
                **kwargs,
            )
            async for event in stream:
                delay = 0.5
                for change in apply(event["type"], event["raw_object"]):
                    yield change
            # The server ended the watch (its timeout, a restart): resume where we were.
        except ApiException as e:
            if e.status != 410:
                # Forbidden, a server error: say so, keep trying (the RBAC may be fixed).
                log.error(
                    "%s watch refused: %s %s; retrying in %.1f s", what, e.status, e.reason, delay
                )
                await asyncio.sleep(delay)
                delay = min(max_backoff, delay * 2)
                continue
            # Our version is older than the server keeps: list again, report the gap.
            log.info("%s watch: resourceVersion %s expired; listing again", what, version())
            for change in await relist():
                yield change
        except (OSError, ClientError, asyncio.TimeoutError) as e:
            log.warning("%s watch lost (%s); resuming in %.1f s", what, e, delay)
            await asyncio.sleep(delay)
            delay = min(max_backoff, delay * 2)
        finally:
            await w.close()
