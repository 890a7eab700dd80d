"""What hpcdl makes of finished runs: ``table``: the scaling table over many results;
``plot``: its figure; ``straggler``: the verdict over the per-step metrics (pure);
``read``: a finished run's straggler verdicts and a probe run's report. The record of
one ended job (result.json, which rank failed) is hpcdl.jobs' ``result`` and ``logs``;
what the job itself writes (the result and checksum lines, the per-step metrics files)
is hpcdl.jobside's ``protocol`` and ``steps``, stdlib only, staged into every job.
"""
