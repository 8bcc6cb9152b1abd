"""The usage store as the master serves it: the store and its upkeep, and the
HTTP routes that ask it questions (docs/usage-store.md).

`UsageService` owns the `UsageStore` for the master shell: it builds it inside the
running loop, expires old rows on a timer, closes it at shutdown, and reports its
figures for `/metrics/snapshot`. The store is an observer: nothing it does, fails
at or takes long over may stop, slow or step down the master, so its failures are
logged and counted here and never raised into the shell's loops.

Routes (added by master/http.py): `POST /usage/query` with
``{"sql": "SELECT ...", "max_rows": 100, "timeout": 2}`` answers the result as
JSON (columns, types, rows, truncated, elapsed_ms); a refused or failed query
answers its `QueryError`'s 4xx with the engine's message; `GET /usage/tables`
lists the tables, their columns and row counts; `GET /usage/view?by=app&window=3600`
answers the web UI's usage view from canned queries (master/usage_view.py), so
the page sends no SQL of its own for it. With the store off all three are 404.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from dyad import bounded_json
from master import usage_view
from master.usage import TABLES, QueryError, StoreConfig, UsageStore
from master.usage.process_engine import ProcessEngine

log = logging.getLogger(__name__)

MAX_EXPIRY_INTERVAL = 60.0  # seconds between expiry passes, at most
HELPERS = ("bucket(ts, seconds)", "ago(INTERVAL 1 HOUR)", "epoch_ts(seconds)")


class UsageService:
    """The master's usage store and its upkeep. Create it inside the running loop."""

    def __init__(self, config: StoreConfig, memory_limit: str,
                 now: Callable[[], float]) -> None:
        self.config = config
        # DuckDB in a process of its own: off the master's GIL and event loop.
        self.store = UsageStore(ProcessEngine(memory_limit=memory_limit), config)
        self._now = now
        self._expiry: asyncio.Task[None] | None = None
        self.expire_errors = 0
        self.bad_requests = 0  # bodies that are not a query (bad SQL counts in the store)

    def start(self) -> None:
        self._expiry = asyncio.get_running_loop().create_task(self._keep_expiring())

    async def _keep_expiring(self) -> None:
        every = max(1.0, min(MAX_EXPIRY_INTERVAL, self.config.retention / 10))
        while True:
            await asyncio.sleep(every)
            try:
                await self.store.expire(self._now())
            except Exception:  # an observer's failure: counted, never the master's
                self.expire_errors += 1
                log.exception("usage store: expiring old rows failed")

    async def close(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            await asyncio.gather(self._expiry, return_exceptions=True)
        try:
            await self.store.close()
        except Exception:
            log.exception("usage store: closing failed")

    def now(self) -> float:
        """The master's clock: the one the rows' times were taken with."""
        return self._now()

    def metrics(self) -> dict[str, float]:
        """The store's figures for `/metrics/snapshot` (`usage/...`)."""
        figures = {f"usage/{name}": value for name, value in self.store.stats.items()}
        figures["usage/expire_errors"] = self.expire_errors
        figures["usage/bad_requests"] = self.bad_requests
        return figures


UsageOf = Callable[[web.Request], "UsageService | None"]


def routes(usage_of: UsageOf) -> list[web.RouteDef]:
    """The usage routes; `usage_of(request)` is the master's service (None: off)."""

    Handler = Callable[[web.Request, UsageService], Awaitable[web.Response]]

    def answering(handler: Handler) -> Callable[[web.Request], Awaitable[web.Response]]:
        """The handler with the store found, and refusals and query errors answered."""
        async def answer(request: web.Request) -> web.Response:
            try:
                usage = usage_of(request)
                if usage is None:
                    raise _Refused(404, "the usage store is off (dyad-master --usage-store off)")
                return await handler(request, usage)
            except _Refused as refused:
                return _error(request, refused.status, refused.message)
            except QueryError as error:
                return _error(request, error.status, str(error))
        return answer

    @answering
    async def query(request: web.Request, usage: UsageService) -> web.Response:
        try:
            sql, max_rows, timeout = _query_body(await request.read())
        except _Refused:
            usage.bad_requests += 1
            raise
        result = await usage.store.query(sql, max_rows, timeout)
        return web.json_response(_finite(result.as_json()))

    @answering
    async def tables(request: web.Request, usage: UsageService) -> web.Response:
        counts = await usage.store.counts()
        return web.json_response({
            "tables": {name: {"rows": counts.get(name, 0),
                              "columns": [{"name": c, "type": t} for c, t in columns]}
                       for name, columns in TABLES.items()},
            "helpers": list(HELPERS), "retention_seconds": usage.config.retention,
            "max_rows": usage.config.max_rows, "query_rows": usage.config.query_rows,
            "query_timeout_seconds": usage.config.query_timeout})

    @answering
    async def view(request: web.Request, usage: UsageService) -> web.Response:
        try:
            wanted = usage_view.parse(request.query)
        except usage_view.ViewError as error:
            usage.bad_requests += 1
            raise _Refused(400, str(error)) from None
        now = usage.now()
        # One query after another: the view never holds more than one query slot.
        series, groups, events = [await usage.store.query(sql(wanted, now)) for sql in (
            usage_view.series_sql, usage_view.groups_sql, usage_view.events_sql)]
        return web.json_response(_finite(usage_view.shape(
            wanted, now, *(answer.as_json()["rows"] for answer in (series, groups, events)),
            groups_truncated=groups.truncated)))

    return [web.post("/usage/query", query), web.get("/usage/tables", tables),
            web.get("/usage/view", view)]


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _error(request: web.Request, status: int, message: str) -> web.Response:
    # The same shape as every other master error (master/http.py).
    return web.json_response({"error": message, "path": request.path}, status=status)


_SHAPE = '{"sql": "SELECT ...", "max_rows": N (optional), "timeout": SECONDS (optional)}'


def _query_body(raw: bytes) -> tuple[str, int | None, float | None]:
    try:
        body = bounded_json.loads(raw)
    except bounded_json.JsonInputError as exc:
        raise _Refused(400, f"the body must be JSON: {exc.reason}") from None
    if not isinstance(body, dict) or not isinstance(body.get("sql"), str):
        raise _Refused(400, f"the body must be {_SHAPE}")
    unknown = sorted(set(body) - {"sql", "max_rows", "timeout"})
    if unknown:
        raise _Refused(400, f"unknown field(s) {', '.join(unknown)}; the body is {_SHAPE}")
    max_rows, timeout = body.get("max_rows"), body.get("timeout")
    if max_rows is not None and (isinstance(max_rows, bool) or not isinstance(max_rows, int)
                                 or max_rows < 1):
        raise _Refused(400, f"max_rows must be a whole number >= 1, not {max_rows!r}")
    if timeout is not None and (isinstance(timeout, bool)
                                or not isinstance(timeout, (int, float)) or timeout <= 0):
        raise _Refused(400, f"timeout must be a number of seconds > 0, not {timeout!r}")
    return body["sql"], max_rows, None if timeout is None else float(timeout)


def _finite(value: Any) -> Any:
    """NaN and infinities (an average over nothing) as null: strict JSON has neither."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, list):
        return [_finite(v) for v in value]
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value
