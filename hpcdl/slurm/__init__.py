"""hpcdl's Slurm adapter: it talks to Slurm and nothing else. Every Slurm command
runs through hpcdl.proc; functions return values and raise hpcdl errors, never print.

Modules: ``states`` (Slurm -> hpcdl state table), ``parse`` (pure parsers of
Slurm's output), ``query`` (squeue/sacct/scontrol: one job, many jobs in one
batched query, the job list), ``commands`` (sbatch, scancel, log paths, refusal
hints), ``livecheck`` (profile vs cluster), ``scheduler`` (SlurmScheduler, the
hpcdl.scheduler.Scheduler the job lifecycle uses).
"""
