"""The service framework: Marathon-like long-running apps on Dyad.

`dyad-service` keeps ``instances`` healthy tasks of every app running, places them
by constraints, replaces failed ones with backoff, rolls out changes as rolling
upgrades (rolled back when new tasks never become ready), persists its state for
its own failover, and serves Marathon's REST API. See docs/service.md.

Pure modules (no I/O): `appdef` (definitions and validation), `constraints`,
`placement`, `deployment` (the rolling-upgrade rule), `records`, `core` (the state
machine), `views` (API JSON). Shells: `store` (file or ZooKeeper), `runtime`
(driver and timers), `api` (aiohttp), `leader` (ZooKeeper election), `main`.
"""
