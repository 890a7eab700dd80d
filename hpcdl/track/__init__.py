"""`hpcdl track`: a run's per-step metrics, parameters, result and report, exported from
where the network is (the login node, a laptop) into the trackers users already have:
TensorBoard event files and MLflow. Compute nodes are usually offline, so nothing here
runs inside a job; it reads run directories after (or while) the job writes them.

``source``: what a run directory holds, as one value (parameters, the per-step series
aggregated over ranks, the result); reads only, through RunDir and
hpcdl.jobside.steps. ``to_tensorboard`` and ``to_mlflow``: the two sinks, each through
its package's own writer or client (imported only there: both are optional extras), and
idempotent (a step already there is not written again). ``run``: one pass over many
runs, or following them until their jobs end. Nothing here prints.
"""
