"""Scaling sweeps: ``grid`` (the points, their plans and sweep.json; pure) and
``run`` (submit every point, follow them all, collect their results; no output)."""
