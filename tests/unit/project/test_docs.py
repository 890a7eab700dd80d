"""The documentation: README stays a quickstart, the site builds strictly, and the schema
reference is generated from the models (every field, with its description)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from pydantic import BaseModel, Field

from hpcdl.container.spec import ImageSpec
from hpcdl.profiles.schema import Profile
from tests.conftest import require
from tests.unit.project.scriptload import load_script

ROOT = Path(__file__).resolve().parents[3]
README_MAX_LINES = 200
# Material for MkDocs prints a banner about MkDocs 2.0 on every build unless told not to.
MKDOCS_ENV = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}


def _reference() -> ModuleType:
    return load_script("docs_reference")


def _mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    require(importlib.util.find_spec("mkdocs") is not None
            and importlib.util.find_spec("material") is not None,
            "mkdocs and mkdocs-material (pyproject's dev extra)")
    # Never -q: it hides the warnings that --strict counts, and a broken link then passes.
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                           "-f", str(config), "-d", str(site)],
                          capture_output=True, text=True, timeout=300, env=MKDOCS_ENV)


def test_readme_is_a_quickstart() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines; at most {README_MAX_LINES}: move detail to docs/")


def test_readme_docs_links_resolve() -> None:
    text = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\((docs/[^)#\s]*)(?:#[^)\s]*)?\)", text)
    assert len(links) >= 10, "README should link into docs/"
    missing = sorted({link for link in links if not (ROOT / link).is_file()})
    assert not missing, f"README links to missing files: {missing}"


@pytest.mark.slow  # a whole mkdocs build: `make test`, not `make unit`
def test_site_builds_strictly_with_the_generated_reference(tmp_path: Path) -> None:
    out = _mkdocs_build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert out.returncode == 0, out.stdout + out.stderr
    for page, root in (("profile", Profile), ("image-spec", ImageSpec)):
        html = (tmp_path / "site" / "reference" / page / "index.html").read_text()
        assert "<!-- reference:" not in html
        for _path, model in _reference().walk(root, ""):
            for name in model.model_fields:
                assert f"<code>{name}</code>" in html, f"{page}: {model.__name__}.{name}"
    assert (tmp_path / "site" / "scale.png").is_file()


@pytest.mark.slow  # a whole mkdocs build: `make test`, not `make unit`
def test_a_broken_link_or_anchor_fails_the_build(tmp_path: Path) -> None:
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "docs", copy / "docs")
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    (copy / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "docs_reference.py", copy / "scripts")
    (copy / "hpcdl").symlink_to(ROOT / "hpcdl")
    index = copy / "docs" / "index.md"
    index.write_text(index.read_text() + "\n[gone](guide/no-such-page.md), "
                     "[no anchor](guide/submit.md#no-such-section)\n")
    out = _mkdocs_build(copy / "mkdocs.yml", tmp_path / "site")
    assert out.returncode != 0
    assert "guide/no-such-page.md" in out.stderr
    assert "no-such-section" in out.stderr


def test_reference_rows_carry_type_default_and_description() -> None:
    text = _reference().render(Profile, "Profile")
    assert ("| `max_restarts` | integer ≥ 0 | `3` | requeues hpcdl asks for before it lets a "
            "job end (--max-restarts) |") in text
    assert "| `partitions` | list of [Partition](#partitions) | required |" in text
    assert "| `mode` | `\"auto\"` or `\"setuid\"` or `\"unprivileged\"` | `\"auto\"` |" in text
    spec = _reference().render(ImageSpec, "ImageSpec")
    assert "## `pip` {#pip}" in spec and "## `base` {#base}" in spec
    assert "| `horovod` | [Horovod](#horovod) or null | `null` | null: no Horovod |" in spec


def test_a_field_without_description_fails_the_reference() -> None:
    class Bare(BaseModel):
        told: int = Field(default=1, description="has one")
        untold: int = 2

    with pytest.raises(ValueError, match=r"Bare\.untold has no description"):
        _reference().render(Bare, "Bare")


def test_a_marker_naming_no_model_fails_the_reference() -> None:
    page: Any = "# x\n\n<!-- reference: hpcdl.profiles.schema:NoSuchModel -->\n"
    with pytest.raises(ValueError, match="NoSuchModel is not a pydantic model"):
        _reference().expand(page)
