"""hpcdl's Slurm adapter: submit, query, follow, cancel, and the live check of a
profile against the real cluster. Every Slurm command runs through hpcdl.proc.

Modules: ``states`` (Slurm -> hpcdl state table), ``parse`` (pure parsers of
Slurm's output), ``query`` (squeue/sacct/scontrol), ``livecheck`` (profile vs
cluster, and the report `hpcdl profiles diff` prints), ``detect`` (what the cluster
says about itself, for `hpcdl profiles detect`), ``jobs`` (submission and the job
lifecycle).
"""
