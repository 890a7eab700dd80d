"""hpcdl.cli.push's texts: what --dry-run and a push say, from the plan or the result
(the transfers themselves are tested in tests/unit/remote and the integration tier)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from hpcdl.cli.push import DRY_RUN_TOKEN, dry_run_text, pushed_text
from hpcdl.remote.images import Pushed, PushPlan

SHA = "ab" * 32
PLAN = PushPlan(local=Path("/home/u/img.sif"), host="jdoe@login", folder="/home/jdoe/hpcdl-images",
                remote_path=f"/home/jdoe/hpcdl-images/img-{SHA[:16]}.sif", sha256=SHA,
                size=5 * 2**20, mtime_ns=1, already_there=False)
IMAGE = Path("~/img.sif")


def test_dry_run_shows_the_rsync_to_the_temporary_name_then_the_mv():
    copy = ["rsync", "-a", "/home/u/img.sif", f":{PLAN.temp_path(DRY_RUN_TOKEN)}"]
    lines = dry_run_text(IMAGE, PLAN.local, PLAN, copy, as_json=False).splitlines()
    assert lines[0].startswith("would push ~/img.sif (") and lines[0].endswith(
        f"sha256 {SHA}) -> jdoe@login:{PLAN.remote_path}")
    assert lines[1] == (f"  rsync -a /home/u/img.sif "
                        f":/home/jdoe/hpcdl-images/.img-{SHA[:16]}.sif.tmp-RANDOM")
    assert lines[2].startswith("  then on jdoe@login: mv -f")
    assert lines[2].endswith(f".tmp-RANDOM {PLAN.remote_path}")


def test_dry_run_when_nothing_would_move():
    there = replace(PLAN, already_there=True)
    assert dry_run_text(IMAGE, PLAN.local, there, [], as_json=False) == (
        f"~/img.sif already on jdoe@login:{PLAN.remote_path} (sha256 {SHA}; nothing would move)")
    twin = replace(PLAN, twin="/home/jdoe/hpcdl-images/old-name.sif")
    assert dry_run_text(IMAGE, PLAN.local, twin, [], as_json=False) == (
        f"would link jdoe@login:{PLAN.remote_path} to /home/jdoe/hpcdl-images/old-name.sif "
        "there (the same content; nothing would move)")
    data = json.loads(dry_run_text(IMAGE, PLAN.local, there, [], as_json=True))
    assert data["local"] == "/home/u/img.sif" and data["already_there"] is True


def test_pushed_text_for_each_outcome():
    done = Pushed(image="/home/u/img.sif", host="jdoe@login", remote_path="/r/img.sif",
                  sha256=SHA, size=5 * 2**20, bytes_moved=5 * 2**20, already_there=False,
                  seconds=2.04)
    moved = pushed_text(IMAGE, done, as_json=False)
    assert moved.startswith("pushed ~/img.sif -> jdoe@login:/r/img.sif (")
    assert moved.endswith(" moved in 2.0 s)")
    assert pushed_text(IMAGE, replace(done, already_there=True, bytes_moved=0), False) == (
        f"~/img.sif already on jdoe@login:/r/img.sif (sha256 {SHA}; nothing moved)")
    assert pushed_text(IMAGE, replace(done, linked_from="/r/old.sif"), False) == (
        "pushed ~/img.sif -> jdoe@login:/r/img.sif (the same content as /r/old.sif there, "
        "linked; nothing moved)")
    assert json.loads(pushed_text(IMAGE, done, as_json=True))["seconds"] == 2.04
