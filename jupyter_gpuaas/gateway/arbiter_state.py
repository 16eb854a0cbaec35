"""What the three modules of the arbiter share, declared once for the type checker.

`Arbiter` is one class in three modules (arbiter.py, loops.py, views.py): `Loops` and
`Views` are mixed into it and use the state that `Arbiter.__init__` sets, and a few
operations of one another. `ArbiterState` names that state and those operations with their
types, so that `mypy --strict` checks each module on its own; it holds nothing at run time.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from jupyter_gpuaas.admission.core import AdmissionCore
    from jupyter_gpuaas.admission.estimate import History
    from jupyter_gpuaas.admission.model import Config, Decision, Request

    from ..devices import DeviceSample, Inventory
    from .arbiter import Stored
    from .engine import Engine
    from .estimates import Estimates
    from .loops import _Op, _Staged
    from .metrics import GatewayMetrics
    from .store import Store

T = TypeVar("T")


class ArbiterState:
    """The arbiter's state (set in `Arbiter.__init__`) and the operations its modules call
    of one another."""

    # Configuration and collaborators.
    quotas: dict[str, Any]
    overrides: dict[str, Any]
    config: Config
    core: AdmissionCore
    history: History  # past hold times, for the estimates (admission/estimate.py)
    estimates: Estimates  # the queue's forward-run estimates, kept until a decision
    store: Store
    inventory: Inventory
    metrics: GatewayMetrics
    lease_ttl: float
    tick: float
    sample_interval: float
    lock_timeout: float
    retention: float
    store_timeout: float

    @property
    def engine(self) -> Engine:
        """The core, or Kueue's decisions (engine.py): Arbiter.engine."""
        raise NotImplementedError

    # The store's threads and health (loops.py).
    _store_pool: concurrent.futures.ThreadPoolExecutor
    _health_pool: concurrent.futures.ThreadPoolExecutor
    _probe: concurrent.futures.Future[None] | None
    _probe_writes: bool
    _hung: set[concurrent.futures.Future[Any]]
    store_state: str
    _store_down_since: float | None
    _settled: asyncio.Event
    _cycler: asyncio.Task[None] | None
    _last_seen: float
    _gap: float
    _probe_timer: asyncio.TimerHandle | None
    broken: str | None
    _last_rebuild: float
    _busy_since: float | None
    _next_prune: float

    # Leadership (leader.py).
    leader: bool
    leader_url: str | None

    # Memory: the live requests and what the API adds to them.
    requests: dict[str, Request]
    keys: dict[tuple[str, str], str]
    meta: dict[str, dict[str, Any]]
    samples: list[DeviceSample]
    hold_times: dict[str, list[float]]
    _last_desired: dict[str, int]
    _wake: asyncio.Event
    _ops: list[_Op]
    _staging: list[_Staged] | None
    _json_cache: dict[str, dict[str, Any]]

    if TYPE_CHECKING:
        # arbiter.py
        def make_config(
            self, quotas: Mapping[str, Any], overrides: Mapping[str, Any] | None = None
        ) -> Config: ...

        def read_stored(self) -> Stored: ...

        def _restored(self, now: float, stored: Stored) -> list[_Staged]: ...

        def commit(
            self, decisions: Sequence[Decision], now: float, extra: Iterable[Request] = ()
        ) -> None: ...

        def _announce(self, st: _Staged) -> None: ...

        def _maybe_scale(self) -> None: ...

        # loops.py
        def read_now(self, fn: Callable[..., T], *args: Any) -> T: ...
