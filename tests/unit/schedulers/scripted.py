"""A scripted stand-in for the executor that hpcdl's Slurm modules take (the Slurm
boundary): answers by tool, remembers each argv."""

from __future__ import annotations

from dataclasses import dataclass, field

from hpcdl.core.proc import Result
from hpcdl.errors import ToolError


@dataclass
class Slurm:
    """``answers[tool]`` is (returncode, stdout), the tool named by its basename (a
    profile's commands directory may prefix it); a tool without an answer fails."""

    answers: dict[str, tuple[int, str]]
    calls: list[list[str]] = field(default_factory=list)
    remote: bool = False
    target: str = "localhost"
    where: str = "this machine"

    def run(self, argv, *, timeout=None, check=True, **_: object) -> Result:
        self.calls.append(list(argv))
        code, out = self.answers.get(argv[0].rsplit("/", 1)[-1], (1, ""))
        if check and code:
            raise ToolError(f"{argv[0]} failed", argv=list(argv), returncode=code, output=out)
        return Result(tuple(argv), code, out, "" if code == 0 else f"{argv[0]}: error")

    def which_all(self, names):
        return {n: (n if n.rsplit("/", 1)[-1] in self.answers else None) for n in names}

    def tools(self) -> list[str]:
        return [c[0] for c in self.calls]

    def __hash__(self) -> int:
        return id(self)
