"""hpcdl's error hierarchy: import it from here.

The library raises these; only the CLI turns them into messages and exit codes
(``exit_code`` 2 for bad input, 1 for a failed tool).

The classes are defined in hpcdl/jobside/errors.py because the job side (staged into
every run and imported there without hpcdl's dependencies or the rest of the package)
raises them too and may import nothing outside hpcdl.jobside (tests/unit/project/
test_layers.py). This module is the name the rest of hpcdl uses; the classes are the
same objects, so ``except HpcdlError`` catches what either name raised.
"""

from __future__ import annotations

from hpcdl.jobside.errors import (
    BuildError,
    ConfigError,
    HpcdlError,
    RenderError,
    SubmitError,
    ToolError,
    UserInputError,
    ValidationError,
)

__all__ = ["BuildError", "ConfigError", "HpcdlError", "RenderError", "SubmitError",
           "ToolError", "UserInputError", "ValidationError"]
