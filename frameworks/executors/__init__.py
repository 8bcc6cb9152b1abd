"""Executors that ship with Dyad. `command` runs tasks that carry a plain
`CommandInfo`; the agent starts it as ``python -m frameworks.executors.command``."""
