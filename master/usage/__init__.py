"""The usage store: every task's usage samples and state changes, kept in memory
for a retention period and answerable with SQL (docs/usage-store.md).

`UsageStore` is what the master shell holds (async, off the event loop); `Engine`
is the blocking store behind it, `DuckDBEngine` the one we ship."""

from master.usage.schema import (
    EVENT_COLUMNS, TABLES, USAGE_COLUMNS, Dimensions, EventItem, UsageSample, event_items)
from master.usage.store import (
    Engine, Expired, QueryBusy, QueryError, QueryRefused, QueryResult, QueryTimeout,
    StoreConfig, UsageStore)

__all__ = [
    "EVENT_COLUMNS", "TABLES", "USAGE_COLUMNS", "Dimensions", "DuckDBEngine", "Engine",
    "EventItem",
    "Expired", "QueryBusy", "QueryError", "QueryRefused", "QueryResult", "QueryTimeout",
    "StoreConfig", "UsageSample", "UsageStore", "event_items", "read_only_statement",
]


def __getattr__(name: str) -> object:
    """DuckDB is imported on first use of the engine: the master core takes its row
    types from this package and must not pay for loading DuckDB (~0.1 s) to do so."""
    if name in ("DuckDBEngine", "read_only_statement"):
        from master.usage import duckdb_engine
        return getattr(duckdb_engine, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
