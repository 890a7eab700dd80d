"""`hpcdl probe`: an allreduce sweep over the allocation and between node
pairs that names slow nodes.

The script every rank runs inside the job is hpcdl.jobside.probe_worker (stdlib at
import, torch inside its ``main``; it prints its report through
hpcdl.jobside.protocol); it holds the pure parts the CLI shares with it too: sizes,
bandwidth maths, the pair schedule and the slow-node verdict. ``request`` turns the
CLI's options into the worker's arguments (validated tokens).
"""
