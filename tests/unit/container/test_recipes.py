"""Dockerfile -> definition (spython's writer) and .def description (spython's parser)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcdl.container.build import plan_build
from hpcdl.container.recipes import convert_dockerfile, dockerfile_name, inspect_definition
from hpcdl.core.resources import REPO_ROOT
from hpcdl.errors import UserInputError


def dockerfile(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "ctx" / "Dockerfile"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    (path.parent / "app.py").write_text("print('hi')\n")
    return path


def test_registry_from_stays_docker(tmp_path):
    text = convert_dockerfile(dockerfile(tmp_path, "FROM python:3.11-slim\nRUN echo hi\n"))
    assert "Bootstrap: docker\nFrom: python:3.11-slim\n" in text
    assert "echo hi" in text


def test_localimage_from_and_base_image_give_localimage(tmp_path):
    local = convert_dockerfile(dockerfile(tmp_path, "FROM localimage:/img/base.sif\n"))
    assert "Bootstrap: localimage\nFrom: /img/base.sif\n" in local
    swapped = convert_dockerfile(dockerfile(tmp_path, "FROM ubuntu:24.04\nCOPY app.py /app/\n"),
                                 base_image="/img/other.sif")
    assert "Bootstrap: localimage\nFrom: /img/other.sif\n" in swapped
    assert "app.py /app/" in swapped


def test_cmd_without_entrypoint_runs_as_given(tmp_path):
    text = convert_dockerfile(dockerfile(tmp_path, 'FROM x:1\nCMD ["python3", "/app/a.py"]\n'))
    assert "/bin/bash python3" not in text
    assert 'exec  python3 /app/a.py "$@"' in text


@pytest.mark.parametrize(("text", "kw", "message"), [
    ("RUN true\n", {}, "has no FROM line"),
    ("FROM a:1 AS b\nFROM c:2\n", {"base_image": "/x.sif"}, r"2 FROM lines \(multi-stage\)"),
    ("FROM a:1\n", {"base_image": "/x y.sif"}, "base-image: '/x y.sif' is not an image reference"),
])
def test_bad_dockerfiles_are_one_line(tmp_path, text, kw, message):
    with pytest.raises(UserInputError, match=message):
        convert_dockerfile(dockerfile(tmp_path, text), **kw)


def test_build_plan_of_a_dockerfile_hashes_the_converted_text_and_context(tmp_path):
    path = dockerfile(tmp_path, "FROM localimage:/nonexistent/base.sif\nCOPY app.py /app/app.py\n")
    base = tmp_path / "base.sif"
    base.write_bytes(b"sif")
    plan = plan_build(str(path), output=tmp_path / "out.sif", base_image=str(base))
    assert plan.name == dockerfile_name(path) == "ctx"
    assert f"From: {base}" in plan.definition
    assert plan.files == ((str(path.parent / "app.py"), "/app/app.py"),)
    first = plan.content_hash
    (path.parent / "app.py").write_text("print('changed')\n")
    assert plan_build(str(path), output=tmp_path / "out.sif", base_image=str(base)).content_hash != first


def test_base_image_only_for_dockerfiles(tmp_path):
    with pytest.raises(UserInputError, match="base-image: only applies to a Dockerfile"):
        plan_build("pytorch-horovod-cpu", base_image="/x.sif")


def test_inspect_definition_reads_header_and_sections():
    info = inspect_definition(REPO_ROOT / "Singularity.def")
    assert info.bootstrap == "docker" and info.base and info.base.startswith("nvcr.io/nvidia/pytorch:")
    assert info.sections[:3] == ["labels", "help", "files"] and "post" in info.sections
    assert any(label.startswith("org.hpcdl.spec ") for label in info.labels)
    assert "./hpcdl /opt/hpcdl/hpcdl" in info.files
    assert info.post_lines > 5


def test_inspect_definition_of_another_bootstrap(tmp_path):
    path = tmp_path / "x.def"
    path.write_text("# mine\nBootstrap: localimage\nFrom: /img/base.sif\n\n%files\n  a.txt /a\n"
                    "%environment\n  export X=1\n%post\n  echo one\n  echo two\n")
    info = inspect_definition(path)
    assert (info.bootstrap, info.base) == ("localimage", "/img/base.sif")
    assert info.sections == ["files", "environment", "post"]
    assert info.files == ["a.txt /a"] and info.post_lines == 2
    (tmp_path / "y.def").write_text("%post\n  true\n")
    with pytest.raises(UserInputError, match="no 'Bootstrap:' line"):
        inspect_definition(tmp_path / "y.def")
