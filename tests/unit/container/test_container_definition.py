"""Golden renders of the bundled image specs, and the root Singularity.def drift check.

Regenerate after an intended change with:
    HPCDL_REGEN_GOLDEN=1 pytest tests/unit/container/test_container_definition.py
(that also rewrites the repo's Singularity.def).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from hpcdl.container.definition import (
    ROOT_CONTEXT,
    RenderContext,
    render_definition,
    render_root_definition,
    root_definition_path,
)
from hpcdl.container.spec import bundled_spec_names, find_spec, load_spec

GOLDEN = Path(__file__).resolve().parent / "golden_containers"
REGEN = os.environ.get("HPCDL_REGEN_GOLDEN") == "1"
# Fixed machine paths: the goldens are the same on every machine.
CTX = RenderContext(cache_dir="/CACHE", project_dir="/PROJECT", spec_dir="/SPECS")
SPECS = ["pytorch-horovod-cpu", "pytorch-horovod-gpu", "pytorch-horovod-gpu-pypi"]


def check_golden(path: Path, text: str) -> None:
    if REGEN:
        path.write_text(text)
    assert path.exists(), f"missing golden {path}; run with HPCDL_REGEN_GOLDEN=1"
    assert text == path.read_text(), f"{path.name} drifted; HPCDL_REGEN_GOLDEN=1 regenerates"


def render(name: str, ctx: RenderContext = CTX) -> str:
    return render_definition(load_spec(find_spec(name)), ctx).text


def test_bundled_specs_are_the_three_images() -> None:
    assert set(SPECS) <= set(bundled_spec_names())


@pytest.mark.parametrize("name", SPECS)
def test_golden(name: str) -> None:
    check_golden(GOLDEN / f"{name}.def", render(name))


def test_the_torchvision_example_spec_installs_from_pytorchs_cpu_index() -> None:
    """examples/specs/pytorch-cpu-torchvision.yaml: the CPU image plus the torchvision
    built for its torch, where PyTorch's index answers (docs/guide/build.md)."""
    spec = Path(__file__).resolve().parents[3] / "examples" / "specs" / \
        "pytorch-cpu-torchvision.yaml"
    text = render_definition(load_spec(spec), CTX).text
    check_golden(GOLDEN / "pytorch-cpu-torchvision.def", text)
    assert "Bootstrap: localimage\nFrom: /scratch/images/pytorch-horovod-cpu.sif\n" in text
    assert "export PIP_INDEX_URL=https://download.pytorch.org/whl/cpu\n" in text
    assert "export PIP_EXTRA_INDEX_URL=https://pypi.org/simple\n" in text
    assert "python3 -m pip install torchvision==0.28.0 tqdm tensorboard\n" in text
    assert "apt-get" not in text  # the base image's MPI and Python are kept


def test_the_offline_example_spec_installs_resolved_wheels_with_no_index() -> None:
    """examples/specs/cpu-offline-extras.yaml (pip.resolve: host), rendered with a
    resolved wheelhouse (hpcdl.container.wheels; docs/guide/build.md)."""
    spec = Path(__file__).resolve().parents[3] / "examples" / "specs" / \
        "cpu-offline-extras.yaml"
    ctx = RenderContext(cache_dir="/CACHE", project_dir="/PROJECT", spec_dir="/SPECS",
                        wheels="/CACHE/wheelhouses/KEY",
                        wheels_target="CPython 3.11 on manylinux_2_36_x86_64")
    text = render_definition(load_spec(spec), ctx).text
    check_golden(GOLDEN / "cpu-offline-extras.def", text)
    assert "%files\n    /CACHE/wheelhouses/KEY /opt/hpcdl-wheels\n" in text
    assert ("    python3 -m pip install --no-index --find-links /opt/hpcdl-wheels tqdm msgpack\n"
            "    rm -rf /opt/hpcdl-wheels\n") in text
    assert "PIP_INDEX_URL" not in text and "apt-get" not in text
    # without a resolved wheelhouse the same spec would install from the index
    assert "pip install tqdm msgpack\n" in render_definition(load_spec(spec), CTX).text


def test_root_singularity_def_is_the_rendered_default_image() -> None:
    text = render_root_definition()
    if REGEN:
        root_definition_path().write_text(text)
    assert root_definition_path().read_text() == text, (
        "Singularity.def drifted from containers/pytorch-horovod-gpu.yaml; "
        "HPCDL_REGEN_GOLDEN=1 pytest tests/unit/container/test_container_definition.py rewrites it"
    )
    assert render("pytorch-horovod-gpu", ROOT_CONTEXT) == text


def sections(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    current = "header"
    for line in text.splitlines():
        if line.startswith("%"):
            current = line.split()[0]
            out[current] = ""
        else:
            out[current] = out.get(current, "") + line + "\n"
    return out


def test_cpu_image_lines_that_matter() -> None:
    s = sections(render("pytorch-horovod-cpu"))
    assert "Bootstrap: debootstrap" in s["header"]
    assert "OSVersion: bookworm" in s["header"]
    assert "MirrorURL: http://deb.debian.org/debian" in s["header"]
    # The wheelhouse is a spec field resolved against the cache, never a fixed host path.
    assert "/CACHE/wheelhouse /opt/wheelhouse" in s["%files"]
    assert "/PROJECT/hpcdl /opt/hpcdl/hpcdl" in s["%files"]
    assert "/PROJECT/examples /opt/hpcdl/examples" in s["%files"]
    assert "export PYTHONPATH=/opt/hpcdl" in s["%environment"]
    post = s["%post"]
    install = next(ln for ln in post.splitlines() if "--no-index" in ln)
    assert "torch==2.13.0" in install and "horovod==0.28.1" in install
    assert "mpi4py" in install and "numpy" in install and "pillow" in install
    # torch is never installed unpinned.
    for ln in post.splitlines():
        assert not re.search(r"\btorch(?!==2\.13\.0)\b(?![-_])", ln.split("#")[0].replace("torch==2.13.0", "")), ln
    assert "openmpi-bin" in post
    assert "org.hpcdl.mpi.flavour openmpi" in s["%labels"]
    assert "org.hpcdl.mpi.version 4.1.4" in s["%labels"]
    assert "org.hpcdl.pmix.version 4.2.2" in s["%labels"]
    assert "horovodrun -cb" in s["%test"]


def test_gpu_image_lines_that_matter() -> None:
    s = sections(render("pytorch-horovod-gpu"))
    assert "Bootstrap: docker" in s["header"]
    assert "From: nvcr.io/nvidia/pytorch:24.10-py3" in s["header"]
    post = s["%post"]
    # The C++17 fix on BOTH CMakeLists, NCCL, MPI and Gloo, no build isolation.
    assert "horovod-0.28.1/CMakeLists.txt" in post
    assert "horovod-0.28.1/horovod/torch/CMakeLists.txt" in post
    assert "set(CMAKE_CXX_STANDARD 17)" in post
    assert "HOROVOD_GPU_OPERATIONS=NCCL" in post
    assert "HOROVOD_WITH_MPI=1" in post and "HOROVOD_WITH_GLOO=1" in post
    assert "--no-build-isolation" in post
    assert "torch==" not in post  # torch comes from the NVIDIA base image
    assert "org.hpcdl.horovod.operations NCCL" in s["%labels"]
    assert '\\"nccl\\"' in s["%test"]  # the capability check requires NCCL


@pytest.mark.parametrize("name", SPECS)
def test_post_and_test_sections_are_valid_shell(name: str) -> None:
    s = sections(render(name))
    for section in ("%post", "%test", "%environment"):
        r = subprocess.run(["bash", "-n"], input=s[section], text=True, capture_output=True,
                           timeout=30)
        assert r.returncode == 0, f"{name} {section}: {r.stderr}"


def test_cxx17_patch_applies_to_the_real_cmake_lines(tmp_path: Path) -> None:
    # The sed expression of the template, run on the two lines Horovod 0.28.1 ships.
    post = sections(render("pytorch-horovod-gpu"))["%post"]
    sed = re.search(r"sed -i -E '([^']+)'", post)
    assert sed
    top = tmp_path / "CMakeLists.txt"
    top.write_text("set(CMAKE_CXX_STANDARD 14)\nset(CMAKE_CXX_STANDARD_REQUIRED ON)\n")
    torch_cm = tmp_path / "torch.txt"
    torch_cm.write_text("if(x)\n    set(CMAKE_CXX_STANDARD 14)\nendif()\n")
    subprocess.run(["sed", "-i", "-E", sed.group(1), str(top), str(torch_cm)], check=True,
                   timeout=30)
    assert "set(CMAKE_CXX_STANDARD 17)" in top.read_text()
    assert "CMAKE_CXX_STANDARD_REQUIRED ON" in top.read_text()
    assert "set(CMAKE_CXX_STANDARD 17)" in torch_cm.read_text()


def test_env_values_are_quoted() -> None:
    spec = load_spec(find_spec("pytorch-horovod-cpu"))
    evil = spec.model_copy(update={"env": {"X": "$(touch /tmp/pwned); `id` 'q'"}})
    text = render_definition(evil, CTX).text
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("export X="))
    out = subprocess.run(["bash", "-c", line.strip() + '; printf %s "$X"'], capture_output=True,
                         text=True, timeout=30)
    assert out.stdout == "$(touch /tmp/pwned); `id` 'q'"
