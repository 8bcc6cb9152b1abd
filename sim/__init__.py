"""Fauxmaster: `dyad sim` replays a cell and a workload through Dyad's real cores
(the master with its allocator, the batch and service framework cores, the
scheduler driver's core) on a virtual clock, with simulated agents. See
docs/simulator.md; `sim.run.Simulation` is the entry point for programs."""
