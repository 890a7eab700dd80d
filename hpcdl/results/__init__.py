"""What a training job leaves behind and what hpcdl makes of it.

``protocol`` (stdlib only; the examples import it): the lines a job prints, the
final result line and the per-rank checksum line, written and parsed in one place.
``logs``: which rank failed and what it printed last (pure). ``record``: result.json
of an ended job. ``table``: the scaling table over many results. ``steps`` (stdlib
only; the examples and any script import it): the per-step metrics, one JSON-lines file
per rank, writer and reader. ``straggler``: the verdict over those (pure).

Nothing is imported here, so ``import hpcdl.results.protocol`` inside a job stays
as light as the module itself.
"""
