"""`hpcdl probe`: an allreduce sweep over the allocation and between node
pairs that names slow nodes.

``worker`` is the script every rank runs inside the job (stdlib at import, torch
inside its ``main``; it prints its report through hpcdl.results.protocol) and holds
the pure parts the CLI shares with it: sizes, bandwidth maths, the pair schedule and
the slow-node verdict. ``request`` turns the CLI's options into the worker's
arguments (validated tokens). Nothing is imported here, so importing the worker in a
job stays as light as the worker itself.
"""
