"""hpcdl: distributed deep learning on Slurm clusters in one command.

The CLI path must stay light: nothing imported here may pull in torch.

Layers, lowest first. A module imports from its own layer and the layers listed before
it, never from a later one; the job-side layer needs nothing but the standard library and
the job's training runtime (it is staged into every job and imported there by the
examples and the probe, where hpcdl's own dependencies are not installed).
tests/unit/project/test_layers.py builds the import graph and checks this, and that no import
circle exists (imports made only for type checking are not part of the graph).

    job-side    hpcdl.jobside
    core        hpcdl.core hpcdl.errors
    inputs      hpcdl.profiles hpcdl.container hpcdl.data hpcdl.sandbox hpcdl.remote
    schedulers  hpcdl.schedulers
    planning    hpcdl.plan hpcdl.launch hpcdl.probe hpcdl.hang
    jobs        hpcdl.jobs hpcdl.sweep hpcdl.results hpcdl.report hpcdl.track
    doctor      hpcdl.doctor
    cli         hpcdl.cli hpcdl.__main__
"""

__version__ = "0.1.0"
