"""What an instance's code sees of itself: its name, generation, a
cancellation at eviction, tracked tasks, trays and the cluster client."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable, MutableMapping

from .state import State, Tray

if TYPE_CHECKING:
    from .cluster import ClusterClient


class _Adapter(logging.LoggerAdapter):  # type: ignore[type-arg]
    """Adds the instance's name to a record's extra fields, keeping the
    call's own (the standard adapter replaces them, before Python 3.13)."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        kwargs["extra"] = {**(self.extra or {}), **kwargs.get("extra", {})}
        return msg, kwargs


class WindingDown(Exception):
    """Raised by eviction_checkpoint once the instance is being wound down
    (drain, operator wind-down, hot swap): tracked work should stop there
    and leave the rest to the next activation, which gets durable work
    redelivered."""


class Evicted(WindingDown):
    """Raised by eviction_checkpoint once the instance is being evicted."""


class Instance:
    """One activation of (namespace, id) under a placement generation."""

    def __init__(self, namespace: str, id: str, generation: int, logger: logging.Logger) -> None:
        self.namespace = namespace
        self.id = id
        # The placement generation: every durable write carries it, so a
        # stale activation elsewhere is fenced off.
        self.generation = generation
        self.activated_at = time.time()
        self.logger: logging.LoggerAdapter[logging.Logger] = _Adapter(logger, {"instance": f"{namespace}/{id}"})
        self._stopped = asyncio.Event()
        self._tasks: dict[asyncio.Task[Any], str] = {}
        self._stopping = False
        self._wind_down_ms = 0
        self.state: State = State(self, None, {}, [])
        # Set by the runtime.
        self._on_evict_me: Callable[[], object] = lambda: None
        self._on_fenced: Callable[[], object] = lambda: None
        self._on_reset: Callable[[], object] = lambda: None
        self._cluster: "ClusterClient | None" = None
        # Per-instance objects of libraries built on the SDK, found again
        # from a tray run (Statewire finds its server this way).
        self.attached: dict[object, Any] = {}
        self._fence_done = False
        self._reset_done = False

    # -- cancellation and wind-down ------------------------------------

    @property
    def cancelled(self) -> bool:
        """The instance is being evicted (or was fenced or reset)."""
        return self._stopped.is_set()

    async def wait_cancelled(self) -> None:
        """Returns once the instance is being evicted."""
        await self._stopped.wait()

    @property
    def winding_down(self) -> float | None:
        """The eviction deadline (unix seconds) when being wound down."""
        return self._wind_down_ms / 1000 if self._wind_down_ms else None

    def eviction_checkpoint(self) -> None:
        """Raises Evicted or WindingDown once the instance is going: long
        tracked work calls it between steps."""
        if self.cancelled:
            raise Evicted(f"{self.namespace}/{self.id} is being evicted")
        if self._wind_down_ms:
            raise WindingDown(f"{self.namespace}/{self.id} is winding down")

    def request_eviction(self) -> None:
        """Asks pinnedd to evict this instance once no request is open."""
        self._on_evict_me()

    # -- tracked tasks ---------------------------------------------------

    def spawn(self, name: str, fn: Callable[[], Awaitable[Any]]) -> asyncio.Task[Any] | None:
        """Runs fn() as a tracked task: eviction sets cancelled and waits
        (up to pinnedd's grace) for it to return, then cancels it. An
        exception in it is logged. Once the instance stops, spawn does
        nothing and returns None."""
        if self._stopping:
            return None

        async def tracked() -> Any:
            try:
                return await fn()
            except (asyncio.CancelledError, WindingDown):
                raise
            except Exception:
                self.logger.exception("task failed", extra={"task": name})
            finally:
                self._tasks.pop(asyncio.current_task(), None)  # type: ignore[arg-type]
                # The last task of a winding-down instance returning means
                # it can go before its deadline.
                if not self._tasks and self._wind_down_ms:
                    self.request_eviction()

        task = asyncio.get_running_loop().create_task(tracked(), name=name)
        self._tasks[task] = name
        return task

    @property
    def tasks(self) -> int:
        return len(self._tasks)

    async def _stop_tasks(self, grace: float) -> int:
        """Cancels the instance and gives its tasks grace seconds; returns
        how many had not returned (they are then cancelled)."""
        self._stopping = True
        self._stopped.set()
        pending = [t for t in self._tasks if not t.done()]
        if not pending:
            return 0
        _, still = await asyncio.wait(pending, timeout=grace if grace > 0 else 0.001)
        for t in still:
            t.cancel()
        return len(still)

    # -- state -------------------------------------------------------------

    def tray(self, ns: str, id: str) -> Tray:
        """The instance's tray (ns, id); it exists durably once written."""
        return self.state.tray(ns, id)

    def trays(self, ns: str = "") -> list[tuple[str, str]]:
        """The trays holding something, in namespace ns ("" for all)."""
        return self.state.tray_keys(ns)

    async def durable(self) -> None:
        """Waits until every write this instance made so far is stored.
        Raises Fenced or StateUnavailable when a commit failed."""
        await self.state.durable()

    @property
    def cluster(self) -> "ClusterClient":
        """Calls to any instance of the fleet through this node's front
        door, as this instance's namespace."""
        if self._cluster is None:
            raise RuntimeError("no cluster client outside pinnedd")
        return self._cluster

    # -- called by the state -------------------------------------------

    def _fenced(self) -> None:
        if not self._fence_done:
            self._fence_done = True
            self.logger.warning("instance fenced by a newer activation; stopping")
            self._stopped.set()
            self._on_fenced()

    def _reset(self) -> None:
        if not self._reset_done:
            self._reset_done = True
            self._stopped.set()
            self._on_reset()
