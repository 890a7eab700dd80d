"""The job side: the modules that run inside every job, staged into its run directory
(hpcdl.launch.staging) and imported there by the bundled examples and the probe worker.

Standard library and the job's training runtime only (torch, numpy, mpi4py, horovod,
imported where they are used): hpcdl's own dependencies are not installed in a job's
image. tests/unit/project/test_layers.py checks it.

``errors``: hpcdl's error types (the CLI's one-line errors, exit 2). ``protocol``: the
lines a job prints, the result line and the per-rank checksum line, written and parsed
in one place. ``steps``: the per-step metrics, one JSON-lines file per rank, writer and
reader. ``world``: rank, world size and rendezvous address whatever the launcher.
``imagefolder``: the ImageFolder layout checks. ``requeue``: the contract between a
training script and the batch shell's requeue (the flag file, the progress file, exit
85). ``probe_worker``: the script every rank of `hpcdl probe` runs.

Nothing is imported here, so importing one of these in a job stays as light as the
module itself.
"""
