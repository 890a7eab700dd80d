"""`hpcdl data pack` and `--data DATA.sqfs`, pure: the mksquashfs argv, the refusals
(one line, exit 2, nothing written), a packed file's listing read as an ImageFolder,
and the job script's bind or mount (goldens: HPCDL_REGEN_GOLDEN=1 regenerates)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcdl.cli import cli
from hpcdl.data.mount import image_bind, is_packed_name
from hpcdl.data.packed import (
    SquashTree,
    block_size_for,
    check_packed,
    compression_args,
    pack_plan,
    parse_block_size,
)
from hpcdl.errors import UserInputError, ValidationError
from hpcdl.jobs.preflight import check_inputs
from hpcdl.jobside.imagefolder import scan_tree
from hpcdl.plan import JobRequest, build_plan
from hpcdl.profiles import load_profile
from tests.unit.plan.test_render_golden import GOLDEN, check_golden

JPEG = b"\xff\xd8\xff\xe0" + b"\0" * 16 + b"\xff\xd9"


def dataset(root: Path, classes: int = 2, per_class: int = 2, *, sized: bool = False) -> Path:
    """An ImageFolder of tiny JPEGs; ``sized``: image i of a class is i bytes longer."""
    for split in ("train", "val"):
        for c in range(classes):
            d = root / split / f"n{c:08d}"
            d.mkdir(parents=True)
            for i in range(per_class):
                (d / f"{i}.JPEG").write_bytes(JPEG + bytes(i if sized else 0))
    return root


def test_pack_argv_is_deterministic_and_writes_beside_the_output(tmp_path):
    src = dataset(tmp_path / "tiny")
    plan = pack_plan(src, tmp_path / "tiny.sqfs", processors=2)
    assert plan.argv[:3] == ("mksquashfs", str(src), str(plan.temp))
    assert plan.temp.parent == tmp_path and plan.temp.name.startswith(".tiny.sqfs.tmp-")
    for option in ("-noappend", "-no-xattrs", "-all-root", "-info", "-no-progress"):
        assert option in plan.argv
    argv = " ".join(plan.argv)
    assert "-mkfs-time 0 -all-time 0" in argv and "-root-mode 0755" in argv
    assert "-comp gzip" in argv and argv.endswith("-processors 2")
    assert (plan.classes, plan.counts, plan.files) == (2, {"train": 4, "val": 4}, 8)
    assert plan.record_path == tmp_path / "tiny.sqfs.hash"
    assert compression_args("none")[0] == "-noI" and compression_args("lz4") == ["-comp", "lz4"]


@pytest.mark.parametrize("make, output, words", [
    (lambda p: p.mkdir(), "x.sqfs", "no train/ directory"),
    (lambda p: dataset(p), "x.tar", "name the packed file *.sqfs"),
    (lambda p: dataset(p), "nodir/x.sqfs", "no directory"),
    (lambda p: (dataset(p), (p.parent / "x.sqfs").write_bytes(b"old")), "x.sqfs", "exists"),
    (lambda p: dataset(p), "src/x.sqfs", "inside the dataset"),
])
def test_pack_refusals_are_one_line_exit_2_and_write_nothing(tmp_path, make, output, words):
    src = tmp_path / "src"
    make(src)
    before = sorted(p.name for p in tmp_path.iterdir())
    res = CliRunner().invoke(cli, ["data", "pack", str(src), "-o", str(tmp_path / output)])
    assert res.exit_code == 2, res.output
    assert words in res.output and res.output.count("error:") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_pack_dry_run_prints_the_argv_and_writes_nothing(tmp_path):
    src = dataset(tmp_path / "tiny")
    res = CliRunner().invoke(cli, ["data", "pack", str(src), "-o", str(tmp_path / "t.sqfs"),
                                   "--dry-run", "--compression", "lz4"])
    assert res.exit_code == 0, res.output
    assert res.output.startswith("mksquashfs ") and "-comp lz4" in res.output
    res = CliRunner().invoke(cli, ["data", "pack", str(src), "-o", str(tmp_path / "t.sqfs"),
                                   "--dry-run", "--json"])
    assert json.loads(res.output)["argv"][0] == "mksquashfs"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny"]


LISTING = """\
drwxr-xr-x 0/0                      82 1970-01-01 00:00 squashfs-root
-rw-r--r-- 0/0                      57 1970-01-01 00:00 squashfs-root/.hpcdl-tiny
drwxr-xr-x 0/0                     221 1970-01-01 00:00 squashfs-root/train
drwxr-xr-x 0/0                      40 1970-01-01 00:00 squashfs-root/train/n0
-rw-r--r-- 0/0                     943 1970-01-01 00:00 squashfs-root/train/n0/a b.JPEG
-rw-r--r-- 0/0                     943 1970-01-01 00:00 squashfs-root/train/n0/c.JPEG
drwxr-xr-x 0/0                      40 1970-01-01 00:00 squashfs-root/train/n1
-rw-r--r-- 0/0                     943 1970-01-01 00:00 squashfs-root/train/n1/d.jpg
lrwxrwxrwx 0/0                       5 1970-01-01 00:00 squashfs-root/train/n1/l.jpg -> d.jpg
drwxr-xr-x 0/0                     221 1970-01-01 00:00 squashfs-root/val
drwxr-xr-x 0/0                      40 1970-01-01 00:00 squashfs-root/val/n1
-rw-r--r-- 0/0                     943 1970-01-01 00:00 squashfs-root/val/n1/e.JPEG
"""


class FakeHeads(SquashTree):
    def heads(self, rels):
        return {r: JPEG[:8] for r in rels}


def test_a_packed_listing_is_checked_as_an_imagefolder():
    folder = scan_tree(Path("/d.sqfs"), FakeHeads(Path("/d.sqfs"), LISTING))
    assert folder.classes == ("n0", "n1")
    assert folder.counts() == {"train": 3, "val": 1}
    assert ("/d.sqfs/train/n0/a b.JPEG", 0) in folder.samples["train"]
    missing_val = "\n".join(x for x in LISTING.splitlines() if "/val" not in x)
    with pytest.raises(UserInputError, match="no val/ directory"):
        scan_tree(Path("/d.sqfs"), FakeHeads(Path("/d.sqfs"), missing_val))


@pytest.mark.parametrize("content, words", [
    (None, "no such file"), (b"", "starts with nothing"), (b"PK\3\4zip", "not a SquashFS file"),
])
def test_check_packed_refuses_what_is_not_squashfs(tmp_path, content, words):
    path = tmp_path / "d.sqfs"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(UserInputError, match=words):
        check_packed(path)
    check_packed_ok = tmp_path / "ok.sqfs"
    check_packed_ok.write_bytes(b"hsqs" + b"\0" * 60)
    check_packed(check_packed_ok)
    res = CliRunner().invoke(cli, ["data", "check", str(path)])
    assert res.exit_code == 2 and res.output.count("error:") == 1, res.output


def test_submit_preflight_refuses_a_file_that_is_not_squashfs(tmp_path):
    bad = tmp_path / "d.sqfs"
    bad.write_text("not squashfs")
    with pytest.raises(ValidationError, match="data: .* is not a SquashFS file"):
        check_inputs(JobRequest.of(nodes=1, gpus=0, data=str(bad)))
    with pytest.raises(ValidationError, match="data: .*no such file"):
        check_inputs(JobRequest.of(nodes=1, gpus=0, data=str(tmp_path / "none.sqfs")))


DATA = "/scratch/data/imagenet.sqfs"
IMAGE = "/scratch/images/pytorch-horovod.sif"


@pytest.mark.parametrize("case, req", [
    ("packed-image", JobRequest.of(nodes=2, gpus=2, image=IMAGE, data=DATA,
                                run_dir="/scratch/runs/p1")),
    ("packed-native", JobRequest.of(nodes=2, gpus=2, no_image=True, data=DATA,
                                 run_dir="/scratch/runs/p2")),
])
def test_packed_data_golden(case, req):
    plan = build_plan(load_profile("sandbox"), req)
    check_golden(GOLDEN / "sbatch" / f"sandbox-{case}.sh", plan.script)
    if req.container.image:
        assert image_bind(DATA) == f"{DATA}:/data:image-src=/,ro"
        assert plan.container.binds[-1] == image_bind(DATA) and "--data /data " in plan.launch.launch_line
        assert "squashfuse" not in plan.script and "export HPCDL_DATA=/data" in plan.script
    else:
        assert '--data "$HPCDL_DATA"' in plan.launch.launch_line
        assert 'export HPCDL_DATA=/local/hpcdl-data-"$SLURM_JOB_ID"' in plan.script
        assert "trap hpcdl_data_unmount EXIT" in plan.script
        # squashfuse_ll where the node has it, else squashfuse: chosen on the node.
        mount = plan.script.index('exec "$m" -f "$1" "$2"')
        assert plan.script.index("command -v squashfuse_ll") < mount
        assert mount < plan.script.index(plan.launch.launch_line)


def test_packed_data_refusals():
    sandbox = load_profile("sandbox")
    with pytest.raises(ValidationError, match="--data: /opt/d.sqfs is not on a path the "
                                              "compute nodes share"):
        build_plan(sandbox, JobRequest.of(nodes=1, gpus=0, image=IMAGE, data="/opt/d.sqfs"))
    with pytest.raises(ValidationError, match="profile polaris is pbs: give --image"):
        build_plan(load_profile("polaris"), JobRequest.of(nodes=1, gpus=1, no_image=True, data=DATA))
    # A directory tree stays what it was: no bind, no mount.
    plan = build_plan(sandbox, JobRequest.of(nodes=1, gpus=0, no_image=True, data="/scratch/d"))
    assert "squashfuse" not in plan.script and "--data /scratch/d" in plan.launch.launch_line
    assert is_packed_name("X.SquashFS") and not is_packed_name("x.sif")


def test_block_size_follows_the_files_median_size_between_4k_and_128k(tmp_path):
    # 1 KB images: 4K fragments, so a shuffled read decompresses ~4 images per image,
    # not ~100 (the measurement is in BLOCK_SIZES' comment); ImageNet's ~110 KB keep 128K.
    assert block_size_for([900, 1100, 1000]) == 4096
    assert block_size_for([19_000] * 3) == 32 * 1024
    assert block_size_for([110_000] * 5 + [1]) == 128 * 1024
    assert block_size_for([5_000_000]) == 128 * 1024 and block_size_for([]) == 128 * 1024
    assert parse_block_size("auto") is None and parse_block_size("64K") == 65536
    assert parse_block_size("1M") == 1 << 20 and parse_block_size("8192") == 8192
    for bad in ("3K", "2M", "0", "-4K", "4 K", "lots", "2K"):
        with pytest.raises(UserInputError, match=r"--block-size .*power of two from 4K to 1M"):
            parse_block_size(bad)


def test_pack_argv_carries_the_chosen_block_size(tmp_path):
    src = dataset(tmp_path / "ds")  # tiny JPEGs
    auto = pack_plan(src, tmp_path / "a.sqfs")
    assert auto.block_size == 4096 and " -b 4096 " in " ".join(auto.argv) + " "
    fixed = pack_plan(src, tmp_path / "b.sqfs", block_size=1 << 20)
    assert fixed.block_size == 1 << 20 and "-b" in fixed.argv
    assert fixed.argv[fixed.argv.index("-b") + 1] == str(1 << 20)
