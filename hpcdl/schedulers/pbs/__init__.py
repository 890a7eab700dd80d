"""PBS Pro (ALCF Polaris): the ``#PBS`` script dialect (``script``). hpcdl renders
these scripts for reading and does not submit them (no adapter in
hpcdl.schedulers.registry): ``refuse`` says so in one line.
"""
