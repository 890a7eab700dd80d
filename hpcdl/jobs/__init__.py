"""The job flows between the planning layer and the CLI: a job from its plan to its
outcome (``flow``), a scaling sweep from its plans to its table (``sweep``), what a
finished run or sweep holds (``results``) and what a job's run directory adds to its
scheduler status (``status``).

These modules never print: progress goes to callbacks the caller passes (as
hpcdl.jobs.follow's ``on_poll``), and what happened comes back as values that hpcdl.cli
displays. They are handed the scheduler and never pick one.
"""
