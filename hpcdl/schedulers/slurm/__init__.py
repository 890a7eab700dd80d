"""hpcdl's Slurm adapter: it talks to Slurm and nothing else. Every Slurm command
runs through the Executor the adapter is given (hpcdl.schedulers.executor; here:
hpcdl.core.proc); functions return values and raise hpcdl errors, never print.

Modules: ``states`` (Slurm -> hpcdl state table), ``parse`` (pure parsers of
Slurm's output), ``query`` (squeue/sacct/scontrol: one job, many jobs in one
batched query, the job list), ``commands`` (sbatch and its argv, scancel, log paths,
refusal hints, srun --overlap into a running job), ``livecheck`` (profile vs cluster,
and the report `hpcdl profiles diff` prints), ``detect`` (what the cluster says about
itself, for `hpcdl profiles detect`), ``describe`` (those facts as a commented
profile), ``adapter`` (SlurmScheduler, the
hpcdl.schedulers.base.Scheduler the job lifecycle uses).
"""
