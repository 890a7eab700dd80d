"""hpcdl/data/packed.py: the --block-size and --compression options, the "auto" block
size rule as properties, and execute() run with the real mksquashfs on a small tree
(the record beside the file, the progress calls, nothing left behind when mksquashfs
fails). The argv and refusals: test_data_pack.py; links: test_data_links.py."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcdl.data.packed import (
    AUTO_BLOCK_MAX,
    BLOCK_SIZES,
    COMPRESSIONS,
    block_size_for,
    check_images,
    compression_args,
    execute,
    pack_plan,
    parse_block_size,
    scan_packed,
)
from hpcdl.errors import ToolError, UserInputError
from hpcdl.jobside.imagefolder import scan_imagefolder
from tests.unit.data.test_data_pack import JPEG
from tests.unit.data.test_data_pack import dataset as pack_dataset


def dataset(root: Path) -> Path:
    """test_data_pack's ImageFolder, 3 images a class of 3 sizes."""
    return pack_dataset(root, per_class=3, sized=True)


@pytest.mark.parametrize("size", BLOCK_SIZES)
def test_every_block_size_is_read_in_each_spelling(size):
    spellings = {str(size), f"{size // 1024}K", f"{size // 1024}k", f" {size // 1024}K "}
    if size % (1024 * 1024) == 0:
        spellings.add(f"{size // (1024 * 1024)}M")
    assert {parse_block_size(s) for s in spellings} == {size}


@given(st.integers(0, 4 * 1024 * 1024).filter(lambda n: n not in BLOCK_SIZES))
def test_a_block_size_mksquashfs_does_not_take_is_refused(n):
    for text in (str(n), f"{n}K"):
        if text == f"{n}K" and n * 1024 in BLOCK_SIZES:
            continue
        with pytest.raises(UserInputError, match="auto, or a power of two from 4K to 1M"):
            parse_block_size(text)


@pytest.mark.parametrize("text", ["auto", "AUTO", " Auto "])
def test_auto_is_none(text):
    assert parse_block_size(text) is None


@pytest.mark.parametrize("text", ["", "K", "64KB", "-4K", "1G", "64 K", "4096.0"])
def test_nonsense_block_sizes_are_refused(text):
    with pytest.raises(UserInputError):
        parse_block_size(text)


@given(st.lists(st.integers(0, 10**7), max_size=50))
def test_auto_takes_the_smallest_block_at_least_the_median_up_to_128k(sizes):
    block = block_size_for(sizes)
    assert block in BLOCK_SIZES and 4096 <= block <= AUTO_BLOCK_MAX
    if not sizes:
        assert block == AUTO_BLOCK_MAX
        return
    median = sorted(sizes)[len(sizes) // 2]
    if median <= AUTO_BLOCK_MAX:
        assert block >= median
        assert block == 4096 or block // 2 < median  # the smallest such power of two


def test_the_auto_rule_on_figures_from_its_comment():
    assert block_size_for([1000] * 5) == 4096
    assert block_size_for([19_000] * 5) == 32 * 1024
    assert block_size_for([110_000] * 5) == 128 * 1024
    assert block_size_for([1000, 1000, 5_000_000]) == 4096  # the median, not the mean


def test_compression_options():
    assert compression_args("gzip") == ["-comp", "gzip"]
    assert compression_args("zstd") == ["-comp", "zstd"]
    assert compression_args("none") == ["-noI", "-noId", "-noD", "-noF", "-noX"]
    assert set(COMPRESSIONS) == {"gzip", "lz4", "zstd", "none"}
    with pytest.raises(UserInputError, match="--compression 'xz' is not one of gzip, lz4, zstd, none"):
        compression_args("xz")


def test_check_images_returns_each_size_and_names_a_cut_jpeg(tmp_path):
    folder = scan_imagefolder(dataset(tmp_path / "d"))
    assert sorted(check_images(folder)) == sorted([len(JPEG) + i for i in range(3)] * 4)
    cut = tmp_path / "d" / "val" / "n00000001" / "2.JPEG"
    cut.write_bytes(JPEG[:-2])
    with pytest.raises(UserInputError, match=f"{cut} is a truncated JPEG") as err:
        check_images(folder)
    assert err.value.hint == "replace or remove it, then pack again"


def test_execute_packs_records_and_reads_back(tmp_path):
    src = dataset(tmp_path / "d")
    (src / "README").write_text("not an image, packed all the same\n")
    out = tmp_path / "d.sqfs"
    plan = pack_plan(src, out, compression="gzip", block_size=4096)
    calls: list[tuple[int, int]] = []
    summary = execute(plan, progress=lambda done, total: calls.append((done, total)))
    assert calls[-1] == (13, 13)  # 12 images and the README: the last file is reported
    record = json.loads((tmp_path / "d.sqfs.hash").read_text())
    assert summary == {"path": str(out), **record}
    assert (record["classes"], record["train"], record["val"], record["files"]) == (2, 6, 6, 13)
    assert record["size"] == out.stat().st_size and len(record["hash"]) == 64
    assert "-b" in record["options"] and "4096" in record["options"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "d.sqfs", "d.sqfs.hash"]
    folder = scan_packed(out)
    assert folder.counts() == {"train": 6, "val": 6} and len(folder.classes) == 2
    # Same tree, same options: the same bytes (the file's hash is a content name).
    again = execute(pack_plan(src, tmp_path / "e.sqfs", compression="gzip", block_size=4096))
    assert again["hash"] == record["hash"] and again["tree_hash"] == record["tree_hash"]


def test_a_failed_mksquashfs_leaves_nothing_behind(tmp_path):
    src = dataset(tmp_path / "d")
    (src / "link").symlink_to(src / "train")  # a link: the exclude and pseudo files too
    plan = pack_plan(src, tmp_path / "d.sqfs")
    assert plan.excludes
    broken = dataclasses.replace(plan, argv=(*plan.argv, "-no-such-option"))
    with pytest.raises(ToolError):
        execute(broken)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]
