"""tests/skip_policy.py in small pytest sessions of their own (pytester): under CI=true a
skip fails, naming the test and the reason; a gpu-marked skip stays a skip; outside CI
nothing changes."""

from __future__ import annotations

import pytest

from tests import skip_policy

SKIPS = '''
import pytest

@pytest.fixture
def missing_image():
    pytest.skip("the image is missing")

def test_body_skip():
    pytest.skip("no tool here")

def test_fixture_skip(missing_image):
    pass

@pytest.mark.skipif(True, reason="root only")
def test_skipif():
    pass

def test_importorskip():
    pytest.importorskip("no_such_module_hpcdl_test")

@pytest.mark.gpu
def test_gpu_skip():
    pytest.skip("no NVIDIA GPU")

@pytest.mark.xfail(reason="known")
def test_xfail():
    assert False

def test_passes():
    assert True
'''


def run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ci: str | None,
        source: str = SKIPS) -> pytest.RunResult:
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    pytester.makeini("[pytest]\nmarkers =\n    gpu: needs an NVIDIA GPU\n")
    pytester.makepyfile(test_policy=source)
    return pytester.runpytest_inprocess("-p", "tests.skip_policy", "-ra")


def test_in_ci_every_skip_fails_with_the_test_and_its_reason(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    result = run(pytester, monkeypatch, "true")
    # body skip and importorskip fail in the call; the fixture's and skipif's in setup
    # (pytest counts a failed setup as an error).
    result.assert_outcomes(passed=1, failed=2, errors=2, skipped=1, xfailed=1)
    out = result.stdout.str()
    for nodeid, when, reason in [
            ("test_policy.py::test_body_skip", "call", "no tool here"),
            ("test_policy.py::test_fixture_skip", "setup", "the image is missing"),
            ("test_policy.py::test_skipif", "setup", "root only"),
            ("test_policy.py::test_importorskip", "call", "could not import"),
    ]:
        assert f"CI=true: a skip is a failure: {nodeid} skipped in {when}: {reason}" in out, out
    # The gpu-marked one stays a skip, with its own reason.
    assert "SKIPPED [1] test_policy.py:" in out and "no NVIDIA GPU" in out


def test_outside_ci_nothing_changes(pytester: pytest.Pytester,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    for ci in (None, "false", "1"):  # only CI=true, as .ci/run sets it, is CI
        result = run(pytester, monkeypatch, ci)
        result.assert_outcomes(passed=1, skipped=5, xfailed=1)
        assert "a skip is a failure" not in result.stdout.str()


def test_in_ci_a_module_skipped_at_collection_fails(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    source = ('import pytest\ntorch = pytest.importorskip("no_such_module_hpcdl_test")\n'
              "def test_x():\n    pass\n")
    result = run(pytester, monkeypatch, "true", source)
    result.assert_outcomes(errors=1)
    assert ("CI=true: a skip is a failure: test_policy.py skipped in collection: "
            "could not import 'no_such_module_hpcdl_test'") in result.stdout.str()
    assert run(pytester, monkeypatch, None, source).ret == pytest.ExitCode.NO_TESTS_COLLECTED


def test_the_allowed_markers_are_registered_with_a_reason(pytestconfig: pytest.Config) -> None:
    registered = {line.split(":")[0] for line in pytestconfig.getini("markers")}
    for name, why in skip_policy.SKIP_ALLOWED.items():
        assert name in registered and why
