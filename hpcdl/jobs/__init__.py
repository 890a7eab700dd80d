"""The job flows between the planning layer and the CLI: a request made ready to submit,
dry run or not (``prepare``: the cluster's view, the checks, the plan), a job from its
plan to its outcome (``flow``) and what a job's run directory adds to its scheduler status
(``status``), over the run directory (``rundir``), submission, following, the hang
watchdog (``watchdog``) and the cluster connection; an ended job's result.json
(``result``) and its failed ranks (``logs``). A sweep's flow is hpcdl.sweep.flow; what a
finished run or sweep holds, hpcdl.sweep.run.load_rows and hpcdl.results.read.

These modules never print: progress goes to callbacks the caller passes (as
hpcdl.jobs.follow's ``on_poll``), and what happened comes back as values that hpcdl.cli
displays. They are handed the scheduler and never pick one.
"""
