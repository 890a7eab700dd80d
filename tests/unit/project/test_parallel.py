"""tests/parallel.py: which xdist group a test runs in (the tests sharing a cluster)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.parallel import SANDBOX, SECOND_TWIN, TWIN, TWIN_2, group_of

REPO = Path(__file__).resolve().parents[3]


@dataclass
class Mark:
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class Item:
    """What group_of reads of a pytest item."""

    fixturenames: list[str]
    params: dict[str, Any] | None = None
    marks: dict[str, Mark] = field(default_factory=dict)
    nodeid: str = "tests/integration/test_x.py::test_y"

    @property
    def callspec(self) -> Any:
        return type("CallSpec", (), {"params": self.params})() if self.params else None

    @property
    def path(self) -> Path:
        return REPO / self.nodeid.split("::", 1)[0]

    def get_closest_marker(self, name: str) -> Mark | None:
        return self.marks.get(name)


@pytest.mark.parametrize(("item", "group"), [
    (Item(["tmp_path"]), None),
    (Item(["netns_cluster", "cpu_image"]), None),
    (Item(["slurm_cluster", "runs_dir"]), SANDBOX),
    (Item(["sandbox_user", "slurm_cluster"]), SANDBOX),
    (Item(["sandbox_twin", "twin_cluster"]), TWIN),
    (Item(["sandbox_twin"], nodeid="tests/integration/test_scale.py::test_y"), TWIN_2),
    (Item(["slurm_cluster"], nodeid="tests/integration/test_scale.py::test_y"), SANDBOX),
    (Item(["slurm_release", "release_sandboxes"], {"slurm_release": "22.05"}), SANDBOX),
    (Item(["slurm_release", "release_sandboxes"], {"slurm_release": "24.11"}), "slurm-24.11"),
    (Item(["release_sandboxes"], {"release": "26.05"}), "slurm-26.05"),
    (Item(["release_sandboxes"], None, {"slurm_release_only": Mark(("24.11",))}),
     "slurm-24.11"),
    (Item(["slurm_cluster"], None, {"xdist_group": Mark(("mine",))}), "mine"),
])
def test_the_group_follows_the_cluster_a_test_uses(item: Item, group: str | None) -> None:
    assert group_of(item) == group  # type: ignore[arg-type]


def test_a_release_sandbox_without_its_release_is_refused_at_collection() -> None:
    with pytest.raises(pytest.UsageError, match="slurm_release_only"):
        group_of(Item(["release_sandboxes"]))  # type: ignore[arg-type]


def test_the_second_twins_modules_exist_and_take_the_twin() -> None:
    # A renamed module would fall back to the first twin's group unnoticed.
    for name in SECOND_TWIN:
        source = (REPO / "tests" / "integration" / name).read_text()
        assert "sandbox_twin" in source, name


def test_under_xdist_the_groups_come_first_biggest_first(pytester: pytest.Pytester) -> None:
    pytester.makeconftest('''
import pytest
pytest_plugins = ["tests.parallel"]

@pytest.fixture
def slurm_cluster():
    return "up"

@pytest.fixture(scope="module")
def sandbox_twin():
    return "twin"
''')
    pytester.makepyfile(test_a='''
def test_single(): pass
def test_twin(sandbox_twin): pass
def test_sandbox_1(slurm_cluster): pass
def test_sandbox_2(slurm_cluster): pass
''')
    pytester.syspathinsert(REPO)  # the plugin is tests.parallel
    res = pytester.runpytest("-p", "xdist", "-n", "1", "--dist", "loadgroup", "-v")
    res.assert_outcomes(passed=4)
    order = [line.split("::")[1].split()[0] for line in res.outlines
             if "PASSED" in line and "::" in line]
    assert order == ["test_sandbox_1@sandbox", "test_sandbox_2@sandbox",
                     "test_twin@sandbox-twin", "test_single"], res.outlines
