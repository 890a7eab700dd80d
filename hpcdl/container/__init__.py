"""Container images: spec schema, definition rendering and builds.

spec.py (typed YAML specs) -> definition.py (pure: spec -> definition text) -> build.py
(plan, then an atomic, logged, content-hashed build) ; runtime.py finds apptainer or
singularity. The doctor (host/image facts and verdicts) is hpcdl.doctor.
"""
