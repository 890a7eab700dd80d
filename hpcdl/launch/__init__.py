"""Launcher-independent process placement (rank, world size, rendezvous address).

Standard library only: imported inside the training image with just PYTHONPATH.
"""

from hpcdl.launch.world import World, detect_world, expand_hostlist, export_torch_env

__all__ = ["World", "detect_world", "expand_hostlist", "export_torch_env"]
