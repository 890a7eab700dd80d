"""What a training job leaves behind and what hpcdl makes of it.

``logs``: which rank failed and what it printed last (pure). ``record``: result.json
of an ended job. ``table``: the scaling table over many results. ``straggler``: the
verdict over the per-step metrics (pure). What the job itself writes (the result and
checksum lines, the per-step metrics files) is hpcdl.jobside's ``protocol`` and
``steps``, stdlib only, staged into every job.
"""
