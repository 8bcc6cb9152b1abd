"""Settings every test shares.

Hypothesis: no per-example deadline. Speed is measured in benchmarks, never in
tests, and on a loaded 2-core machine a deadline turns a slow example into a
spurious "flaky" failure. A failing example is printed with its reproduction blob.
"""

from hypothesis import HealthCheck, settings

settings.register_profile("dyad", deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("dyad")
