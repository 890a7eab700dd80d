"""hpcdl: distributed deep learning on Slurm clusters in one command.

The CLI path must stay light: nothing imported here may pull in torch.
"""

__version__ = "0.1.0"
