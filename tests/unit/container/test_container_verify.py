"""hpcdl/container/verify.py: the import check's one line found in any output (Apptainer's
prefixes, several runs), and the %test section it ships as, read by bash."""

from __future__ import annotations

import subprocess

import pytest

from hpcdl.container.verify import (
    ImportCheck,
    check_section,
    find_import_check,
    import_check_source,
    parse_import_check,
)


@pytest.mark.parametrize(("line", "want"), [
    ("HPCDL_IMPORT_CHECK ok torch 2.5.1+cpu, horovod 0.28.1  ",
     ImportCheck(True, "torch 2.5.1+cpu, horovod 0.28.1")),
    ("INFO:    Running %test script\x1b[0m HPCDL_IMPORT_CHECK FAIL horovod.torch: undefined symbol",
     ImportCheck(False, "horovod.torch: undefined symbol")),
    ("HPCDL_IMPORT_CHECK maybe x", None),
    ("HPCDL_IMPORT_CHECKok x", None),
    ("torch imported", None),
])
def test_one_line(line, want):
    assert parse_import_check(line) == want


def test_the_last_result_of_an_output_counts():
    output = ("HPCDL_IMPORT_CHECK FAIL torch: no module\nrebuilding\n"
              "+ HPCDL_IMPORT_CHECK ok torch 2.5.1\nbye\n")
    assert find_import_check(output) == ImportCheck(True, "torch 2.5.1")
    assert find_import_check("nothing here\n") is None


def test_the_test_section_is_bash_that_skips_an_image_without_its_python(tmp_path):
    section = check_section("no-such-python3")
    assert section.startswith("\n%test\n")
    body = section.split("%test\n", 1)[1]
    assert not any(line.startswith("%") for line in body.splitlines())
    (tmp_path / "test.sh").write_text(body)
    assert subprocess.run(["bash", "-n", str(tmp_path / "test.sh")], check=False,
                          timeout=30).returncode == 0
    res = subprocess.run(["bash", str(tmp_path / "test.sh")], capture_output=True, text=True,
                         timeout=30, check=False)
    assert (res.returncode, res.stdout) == (0, "")
    # The heredoc carries the script's code whole.
    last = import_check_source().rstrip().splitlines()[-1]
    assert f"{last}\nHPCDL_IMPORT_CHECK_PY\n" in body
