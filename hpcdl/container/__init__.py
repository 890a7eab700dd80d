"""Container images: spec schema, definition rendering, builds, and the image doctor.

spec.py (typed YAML specs) -> render.py (pure: spec -> definition text) -> build.py
(plan, then an atomic, logged, content-hashed build) ; runtime.py finds apptainer or
singularity ; doctor.py gathers host/image facts and turns them into verdicts.
"""
