"""hpcdl/profiles/loader.py: the lookup order (--profile, $HPCDL_PROFILE, the user's
folder, the bundled profiles), a user profile hiding a bundled one, and one-line errors,
with the test's own XDG_CONFIG_HOME (tests/unit/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcdl.errors import ConfigError, UserInputError
from hpcdl.profiles.loader import (
    ENV_VAR,
    list_profiles,
    load_profile,
    resolve_profile,
    user_profiles_dir,
)

MINIMAL = ("name: {name}\npartitions:\n  - {{name: p, nodes: 1, gpus_per_node: 0, "
           "cpus_per_node: 2, max_time: '00:10:00'}}\n")


def write_user(name: str, text: str | None = None) -> Path:
    folder = user_profiles_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(text if text is not None else MINIMAL.format(name=name))
    return path


def test_the_user_folder_follows_xdg_config_home(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    assert user_profiles_dir() == tmp_path / "cfg" / "hpcdl" / "profiles"


def test_a_user_profile_hides_the_bundled_one_of_its_name():
    bundled = {s.name: s for s in list_profiles()}
    assert bundled["sandbox"].origin == "bundled"
    path = write_user("sandbox")
    write_user("mine")
    found = {s.name: s for s in list_profiles()}
    assert found["sandbox"].origin == "user" and found["sandbox"].path == path
    assert found["mine"].origin == "user"
    assert [s.name for s in list_profiles()] == sorted(found)
    assert load_profile("sandbox").partitions[0].name == "p"


def test_the_lookup_order(monkeypatch, tmp_path):
    write_user("mine")
    other = tmp_path / "other.yaml"
    other.write_text(MINIMAL.format(name="other"))
    monkeypatch.setenv(ENV_VAR, "mine")
    assert resolve_profile(None).name == "mine.yaml"
    assert resolve_profile(str(other)) == other  # --profile wins over the variable
    assert load_profile().name == "mine"
    monkeypatch.delenv(ENV_VAR)
    with pytest.raises(UserInputError, match=r"profile: none given \(pass --profile NAME\|PATH "
                                             r"or set HPCDL_PROFILE; available: .*mine"):
        resolve_profile(None)


@pytest.mark.parametrize(("ref", "message"), [
    ("nosuch", "profile: unknown profile 'nosuch' (available: "),
    ("./gone.yaml", "profile: file './gone.yaml' does not exist"),
    ("missing.yml", "profile: file 'missing.yml' does not exist"),
])
def test_a_reference_that_names_nothing(ref, message, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserInputError) as err:
        resolve_profile(ref)
    assert err.value.message.startswith(message)


def test_a_folder_or_a_broken_file_is_one_line(tmp_path):
    with pytest.raises(UserInputError, match="is a directory, not a profile file"):
        resolve_profile(str(tmp_path) + "/")
    bad = write_user("bad", "name: bad\npartitions: []\nextra: 1\n")
    with pytest.raises(ConfigError) as err:
        load_profile("bad")
    assert err.value.message.startswith(f"{bad}: unknown key 'extra'")
