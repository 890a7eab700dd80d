"""Image spec schema: what is refused, with the file and the field in the message."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hpcdl.container.spec import (
    expand_path,
    find_spec,
    load_spec,
    parse_spec,
)
from hpcdl.errors import ConfigError, UserInputError


def cpu_data() -> dict:
    return yaml.safe_load(find_spec("pytorch-horovod-cpu").read_text())


def write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def error_of(tmp_path: Path, data: dict) -> str:
    path = write(tmp_path, data)
    with pytest.raises(ConfigError) as exc:
        load_spec(path)
    assert str(path) in exc.value.message
    return exc.value.message


def test_bundled_specs_load() -> None:
    cpu = load_spec(find_spec("pytorch-horovod-cpu"))
    gpu = load_spec(find_spec("pytorch-horovod-gpu"))
    assert cpu.base.bootstrap == "debootstrap" and not cpu.gpu
    assert gpu.base.reference == "nvcr.io/nvidia/pytorch:24.10-py3" and gpu.gpu
    assert cpu.pip.wheelhouse == "${HPCDL_CACHE}/wheelhouse"
    assert "torch==2.13.0" in cpu.pip.local
    assert gpu.horovod and gpu.horovod.gpu_operations == "NCCL"


def test_unknown_top_level_key(tmp_path: Path) -> None:
    data = cpu_data()
    data["bootsrap"] = "docker"
    msg = error_of(tmp_path, data)
    assert "unknown key 'bootsrap'" in msg
    assert "valid keys here:" in msg and "base" in msg


def test_unknown_nested_key(tmp_path: Path) -> None:
    data = cpu_data()
    data["horovod"]["gpu_ops"] = "NCCL"
    msg = error_of(tmp_path, data)
    assert "unknown key 'horovod.gpu_ops'" in msg
    assert "gpu_operations" in msg


def test_wrong_type(tmp_path: Path) -> None:
    data = cpu_data()
    data["apt_packages"] = "openmpi-bin"
    assert "apt_packages" in error_of(tmp_path, data)


@pytest.mark.parametrize("req", ["torch", "torch>=2.1", "torch~=2.13"])
def test_torch_must_be_pinned(tmp_path: Path, req: str) -> None:
    data = cpu_data()
    data["pip"]["local"][0] = req
    msg = error_of(tmp_path, data)
    assert "pip.local" in msg and "torch must be pinned" in msg


def test_gpu_operations_need_gpu(tmp_path: Path) -> None:
    data = cpu_data()
    data["horovod"]["gpu_operations"] = "NCCL"
    assert "needs gpu: true" in error_of(tmp_path, data)


def test_horovod_wheel_needs_pip_local_entry(tmp_path: Path) -> None:
    data = cpu_data()
    data["pip"]["local"] = ["torch==2.13.0"]
    assert "horovod==VERSION entry in pip.local" in error_of(tmp_path, data)


def test_horovod_version_must_agree(tmp_path: Path) -> None:
    data = cpu_data()
    data["pip"]["local"][1] = "horovod==0.28.0"
    assert "disagrees with horovod.version" in error_of(tmp_path, data)


def test_debootstrap_needs_os_version(tmp_path: Path) -> None:
    data = cpu_data()
    del data["base"]["os_version"]
    assert "needs os_version" in error_of(tmp_path, data)


def test_docker_needs_tag(tmp_path: Path) -> None:
    data = yaml.safe_load(find_spec("pytorch-horovod-gpu").read_text())
    del data["base"]["tag"]
    assert "needs tag" in error_of(tmp_path, data)


def test_bad_env_name_and_label(tmp_path: Path) -> None:
    data = cpu_data()
    data["env"] = {"BAD NAME": "1"}
    assert "not an environment variable name" in error_of(tmp_path, data)
    data = cpu_data()
    data["labels"] = {"a b": "1"}
    assert "label" in error_of(tmp_path, data)


def test_debian_package_names_are_checked(tmp_path: Path) -> None:
    data = cpu_data()
    data["apt_packages"].append("evil; rm -rf /")
    assert "not a Debian package name" in error_of(tmp_path, data)


def test_yaml_syntax_error_names_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("name: x\nbase: [\n")
    with pytest.raises(ConfigError) as exc:
        load_spec(path)
    assert f"{path}:" in exc.value.message and "YAML syntax error" in exc.value.message


def test_not_a_mapping() -> None:
    with pytest.raises(ConfigError, match="must be a YAML mapping"):
        parse_spec("- a\n- b\n", source="list.yaml")


def test_unknown_spec_lists_bundled() -> None:
    with pytest.raises(UserInputError) as exc:
        find_spec("no-such-image")
    assert "pytorch-horovod-cpu" in exc.value.message


def test_expand_path_only_hpcdl_variables() -> None:
    kw = {"cache_dir": "/c", "project_dir": "/p", "spec_dir": "/s"}
    assert expand_path("${HPCDL_CACHE}/wheelhouse", **kw) == "/c/wheelhouse"
    assert expand_path("${HPCDL_PROJECT}/x", **kw) == "/p/x"
    assert expand_path("wheels", **kw) == "/s/wheels"
    with pytest.raises(ConfigError, match="only"):
        expand_path("$HOME/wheels", **kw)
