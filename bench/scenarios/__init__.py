"""Benchmark scenarios: one module per scenario, registered in SCENARIOS.

A scenario module has NAME, DESCRIPTION and run_scenario(ctx) -> dict (the scenario's part of
the JSON, including its `goals` list); ctx is a Context. Every scenario runs its
baseline in the same run, and with ctx.old set also the old build, interleaved.
"""

from . import (iscsi_compliance, iscsi_vs_tgt, l2arc, logbias, nbd_vs_nbdkit, picket_fence,
               pool_vs_direct, scrub_impact, slog, tar_sync, throttle)

SCENARIOS = {m.NAME: m for m in (nbd_vs_nbdkit, pool_vs_direct, slog, tar_sync, logbias, throttle,
                                         picket_fence, scrub_impact, l2arc, iscsi_vs_tgt,
                                         iscsi_compliance)}


class Context:
    """What a scenario is asked to do: quick or full, and which builds to run
    (`builds[0]` is this tree's, `builds[1]`, if any, the old revision's)."""

    def __init__(self, quick, builds):
        self.quick = quick
        self.builds = builds

    @property
    def new(self):
        return self.builds[0]

    @property
    def old(self):
        return self.builds[1] if len(self.builds) > 1 else None
