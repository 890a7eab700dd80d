"""How a job's ranks start: the rank environment wrapper (``rankenv``), the files
staged into the run directory (``staging``), the user's code directory (``code``) and
the node guard of a job with spare nodes (``nodes``).

What runs inside the job (rank and world whatever the launcher included) is
hpcdl.jobside, stdlib only.
"""
