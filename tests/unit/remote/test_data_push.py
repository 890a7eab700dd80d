"""A packed dataset over the laptop profile: `hpcdl push DATA.sqfs` names it by content as
it does an image (but keeps .sqfs: submit knows a packed --data by its suffix), and
`submit --data DATA.sqfs` with a login: profile runs the pushed copy, or is refused in
one line when it was never pushed. tests/integration/test_remote_push.py pushes for real."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from hpcdl.cli import cli
from hpcdl.container.hashing import file_sha256
from hpcdl.errors import ValidationError
from hpcdl.jobs.cluster import Cluster, connect
from hpcdl.plan import JobRequest
from hpcdl.profiles import load_profile
from hpcdl.profiles.schema import Profile
from hpcdl.remote import images
from hpcdl.remote.images import check_image, remote_name
from hpcdl.remote.ssh import SshExecutor

SHA = "0123456789abcdef" * 4


@pytest.mark.parametrize("name, expected", [
    ("inet.sqfs", f"inet-{SHA[:16]}.sqfs"),
    ("ImageNet.SquashFS", f"ImageNet-{SHA[:16]}.sqfs"),
    ("img.sif", f"img-{SHA[:16]}.sif"),
])
def test_a_packed_dataset_keeps_its_suffix(name: str, expected: str) -> None:
    assert remote_name(Path("/d") / name, SHA) == expected


def packed(path: Path) -> Path:
    path.write_bytes(b"hsqs" + b"\0" * 2000)
    check_image(path)  # what push checks: a squashfs file is one it copies
    return path


def test_a_remote_dry_run_reads_the_pushed_dataset(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hpcdl.remote import dirs

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(SshExecutor, "run", lambda *a, **k: pytest.fail("ssh was run"))
    cache = Path(os.environ["XDG_CACHE_HOME"]) / "hpcdl" / dirs.HOMES_FILE
    cache.parent.mkdir(parents=True)
    cache.write_text('{"10.77.0.250": "/home/jdoe"}')
    data = packed(tmp_path / "inet.sqfs")
    there = f"/home/jdoe/hpcdl-images/{remote_name(data, file_sha256(data))}"
    res = CliRunner().invoke(cli, ["submit", "-p", "sandbox-remote", "-N", "2", "-G", "1",
                                   "--no-image", "--data", str(data), "--stage-data",
                                   "--dry-run"])
    assert res.exit_code == 0, res.output
    assert f"# not checked: that {data} was pushed to {there}" in res.stderr
    assert f"hpcdl_stage dataset {there} " in res.stdout and str(data) not in res.stdout


def _cluster(prof: Profile) -> Cluster:
    """The profile's handle with a scheduler that finds Slurm there (nothing runs)."""
    cluster = connect(prof)
    cluster._scheduler = SimpleNamespace(require=lambda: None, label="Slurm")  # type: ignore[assignment]
    return cluster


def test_submit_maps_a_local_packed_file_to_its_pushed_copy_or_refuses(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prof = load_profile("sandbox-remote")
    data = packed(tmp_path / "inet.sqfs")
    req = JobRequest.of(nodes=1, gpus=0, no_image=True, data=str(data))
    monkeypatch.setattr(images, "remote_image", lambda ex, login, local: None)
    with pytest.raises(ValidationError) as err:
        _cluster(prof).for_cluster(req)
    assert str(err.value) == (f"data: {data} is not on the cluster yet (profile "
                              f"sandbox-remote reaches it through 10.77.0.250)")
    assert err.value.hint == f"copy it there once: hpcdl push {data} -p sandbox-remote"
    pushed = "/home/jdoe/hpcdl-images/inet-0123456789abcdef.sqfs"
    monkeypatch.setattr(images, "remote_image", lambda ex, login, local: pushed)
    assert _cluster(prof).for_cluster(req).data.path == pushed
    # A path that is no file here is the cluster's already: left as it is.
    there = JobRequest.of(nodes=1, gpus=0, no_image=True, data="/scratch/inet.sqfs")
    assert _cluster(prof).for_cluster(there).data.path == "/scratch/inet.sqfs"
