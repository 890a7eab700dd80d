"""What a training job leaves behind and what hpcdl makes of it.

``protocol`` (stdlib only; the examples import it): the lines a job prints, the
final result line and the per-rank checksum line, written and parsed in one place.
``logs``: which rank failed and what it printed last (pure). ``record``: result.json
of an ended job. ``table``: the scaling table over many results.

Nothing is imported here, so ``import hpcdl.results.protocol`` inside a job stays
as light as the module itself.
"""
