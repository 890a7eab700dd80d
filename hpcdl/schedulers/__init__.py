"""Batch schedulers behind one seam.

``base`` is the seam (the Scheduler protocol, hpcdl's JobState, JobStatus,
SubmitOptions), ``executor`` where an adapter's commands run, ``registry`` the one
place that picks an adapter by the profile's ``scheduler.type``. One package per
scheduler: ``slurm`` (submits, follows, cancels) and ``pbs`` (renders scripts for
reading; hpcdl does not submit to PBS). The job lifecycle imports ``base`` only.
"""
