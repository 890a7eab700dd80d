"""`hpcdl doctor` / `hpcdl inspect`: facts about the host and an image, then verdicts.

Facts are gathered apart from the rules that judge them:

- host.py: HostFacts, gathered by running tools through hpcdl.core.proc (runtime, Slurm,
  nvidia-smi, mpirun). A missing tool is itself a fact, never an exception.
- image.py: ImageFacts, from the image's labels and probe.py run inside it.
- probe.py: the script that runs inside the image with its python (package data, read
  with importlib.resources; hpcdl never imports it).
- profile.py: ProfileFacts, the parts of a cluster profile the rules look at.
- parse.py: pure parsers of tool output (mpirun --version, horovodrun -cb, torch's
  arch flags, apptainer.conf); `srun --mpi=list` is read by the Slurm adapter's
  hpcdl.schedulers.slurm.detect, for the doctor as for `profiles detect`.
- verdicts.py: the rules, a pure function of the facts, each problem with its fix;
  unit-tested on crafted facts without any tool.
"""
