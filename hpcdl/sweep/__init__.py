"""Sweeps: ``grid`` (a scaling sweep's points, their plans and sweep.json; pure),
``params`` (a hyperparameter sweep's points), ``arrays`` (such a sweep as one job
array), ``prepare`` (both kinds made ready to submit, as hpcdl.jobs.prepare does a job), ``run`` (submit every point, follow them all, collect their results, and read
a finished sweep's table; no output), ``flow`` (a scaling sweep from its plans to its
table, results.json and scaling.png) and ``compare`` (the comparison table of a
parameter sweep)."""
