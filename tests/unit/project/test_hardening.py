"""Bad input from files, templates and the command line: one line, exit 2, no traceback.

Example-based companions of test_hostile_property.py (which generates the values):
hostile values in profiles, specs, templates and options, each as the user
meets it through the CLI.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcdl.cli import cli, one_line
from hpcdl.core.templating import render_template
from hpcdl.errors import ConfigError, RenderError
from hpcdl.plan import JobRequest, build_plan
from hpcdl.profiles import load_profile
from hpcdl.profiles.loader import load_profile_file

PROFILE = """\
name: t
scheduler: {account: proj}
partitions:
  - {name: p, nodes: 2, gpus_per_node: 4, cpus_per_node: 8, max_time: "00:30:00"}
env: {omp_num_threads: 1}
"""


def invoke(*args: str):
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False, prog_name="hpcdl")
    assert "Traceback" not in result.output
    return result


def one_error_line(result) -> str:
    """The whole of stderr must be one 'error:' line, maybe followed by one 'hint:' line."""
    lines = result.stderr.splitlines()
    assert lines and lines[0].startswith("error: "), result.stderr
    assert len(lines) == 1 or (len(lines) == 2 and lines[1].startswith("hint: ")), result.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("old", "new", "needle"),
    [
        ("account: proj", 'account: "proj\\nrm -rf ~"', "field 'scheduler.account'"),
        ("account: proj", 'extra_options: {comment: "x\\ntouch pwned"}',
         "field 'scheduler.extra_options.comment'"),
        ("account: proj", 'extra_options: {"a\\nb": x}', "is not a Slurm option name"),
        ("env: {", 'modules: ["gcc/10\\n", "touch pwned"]\nenv: {', "field 'modules[0]'"),
        ("omp_num_threads: 1", "omp_num_threads: -5", "field 'env.omp_num_threads"),
        ("omp_num_threads: 1", "omp_num_threads: true", "field 'env.omp_num_threads"),
        ("omp_num_threads: 1", 'vars: {"A\\nB": x}', "is not an environment variable name"),
        ('max_time: "00:30:00"', 'max_time: "00:30:00\\n"', "is not a Slurm time"),
        ("name: t", "name: t\ndescription: \"two\\nlines\"", "field 'description'"),
    ],
)
def test_hostile_profile_values_are_refused_in_one_line(tmp_path, old, new, needle):
    path = tmp_path / "p.yaml"
    path.write_text(PROFILE.replace(old, new))
    for args in (("profiles", "validate", str(path)),
                 ("submit", "-p", str(path), "-G", "1", "--dry-run", "--", "true")):
        result = invoke(*args)
        assert result.exit_code == 2, result.output
        line = one_error_line(result)
        assert str(path) in line and needle in line
        assert result.stdout == ""


def test_invalid_utf8_profile_spec_and_definition(tmp_path):
    bad = tmp_path / "p.yaml"
    bad.write_bytes(PROFILE.encode().replace(b"proj", b"pr\xffoj"))
    with pytest.raises(ConfigError, match=r"not UTF-8 text \(byte b'\\xff' at offset"):
        load_profile_file(bad)
    for args in (("profiles", "validate", str(bad)), ("build", str(bad), "--dry-run")):
        result = invoke(*args)
        assert result.exit_code == 2 and "is not UTF-8 text" in one_error_line(result)
    definition = tmp_path / "x.def"
    definition.write_bytes(b"Bootstrap: docker\nFrom: debian:\xfe\n")
    result = invoke("build", str(definition), "--dry-run")
    assert result.exit_code == 2
    assert one_error_line(result) == (
        f"error: {definition}: definition is not UTF-8 text (byte b'\\xfe' at offset 31)")


def test_profile_path_that_is_a_directory(tmp_path):
    result = invoke("submit", "-p", str(tmp_path), "-G", "1", "--dry-run")
    assert result.exit_code == 2
    assert "is a directory, not a profile file" in one_error_line(result)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("{{ nope }}", "'nope' is undefined"),
        ("{% if %}", "Expected an expression"),
        ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "refused by the sandbox"),
        ("{{ profile.__class__.__init__.__globals__ }}", "refused by the sandbox"),
        ("{{ 1 / 0 }}", "ZeroDivisionError"),
    ],
)
def test_template_errors_exit_2_and_the_sandbox_holds(tmp_path, text, needle):
    template = tmp_path / "t.sh.j2"
    template.write_text(text + "\n")
    result = invoke("submit", "-p", "sandbox", "-G", "1", "--template", str(template),
                    "--dry-run", "--", "true")
    assert result.exit_code == 2, result.output
    assert needle in one_error_line(result)
    with pytest.raises(RenderError):  # the library raises, only the CLI prints
        build_plan(load_profile("sandbox"),
                   JobRequest.of(gpus=1, template=str(template), command=("true",)))


def test_missing_template_exit_2(tmp_path):
    result = invoke("submit", "-p", "sandbox", "-G", "1", "--template",
                    str(tmp_path / "none.j2"), "--dry-run", "--", "true")
    assert result.exit_code == 2 and "does not exist" in one_error_line(result)
    with pytest.raises(RenderError, match="not found"):
        render_template("none.sh.j2", {}, template_dirs=[tmp_path])


def test_sandboxed_template_still_renders_what_it_is_given(tmp_path):
    (tmp_path / "sbatch.sh.j2").write_text("{{ profile.name }} {{ modules | join(',') }} "
                                           "{{ 'a b' | q }}\n")
    out = render_template("sbatch.sh.j2", {"profile": load_profile("taurus"),
                                           "modules": ["x", "y"]}, template_dirs=[tmp_path])
    assert out == "taurus x,y 'a b'\n"


@pytest.mark.parametrize(
    ("args", "first"),
    [
        (("submit", "-p", "sandbox"), "error: Missing option '--gpus' / '-G'."),
        (("submit", "-p", "sandbox", "-G", "x"),
         "error: Invalid value for '--gpus' / '-G': 'x' is not a valid integer."),
        (("--bogus",), "error: No such option '--bogus'."),
        (("bogus",), "error: No such command 'bogus'."),
        (("profiles", "nope"), "error: No such command 'nope'."),
    ],
)
def test_click_usage_errors_are_one_line_exit_2(args, first):
    result = invoke(*args)
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert lines[0] == first
    assert len(lines) == 2 and lines[1].startswith("hint: see 'hpcdl") and "--help'" in lines[1]


def test_echoed_values_with_newlines_stay_on_one_line():
    result = invoke("submit", "-p", "sandbox", "-G", "1", "--partition", "de\nbug", "--dry-run")
    assert result.exit_code == 2
    assert one_error_line(result).startswith("error: partition: 'de\\nbug' is not a name")
    assert one_line("a\nb\x1b\u2028\tc") == "a\\nb\\x1b\\u2028\tc"


def test_gpus_over_every_partition_names_the_largest(tmp_path):
    result = invoke("submit", "-p", "neuron", "-G", "9", "--dry-run")
    assert result.exit_code == 2
    assert one_error_line(result) == (
        "error: gpus: 9 GPUs per node exceeds the largest nodes of profile neuron, "
        "8 GPUs per node (partitions cas_v100nv_8, amd_a100nv_8)")


@pytest.mark.parametrize("word", ["infinite", "UNLIMITED"])
def test_unlimited_time_on_a_limited_partition(word):
    result = invoke("submit", "-p", "sandbox", "-G", "1", "-t", word, "--dry-run")
    assert result.exit_code == 2
    assert "time: infinite exceeds partition" in one_error_line(result)


def test_sbatch_values_with_spaces_are_quoted_and_quotes_refused(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(PROFILE.replace("account: proj", "extra_options: {comment: two words}"))
    plan = build_plan(load_profile_file(path), JobRequest.of(gpus=1, command=("true",)))
    assert '#SBATCH --comment="two words"\n' in plan.script
    path.write_text(PROFILE.replace("account: proj", "extra_options: {comment: 'a\"b'}"))
    with pytest.raises(ConfigError, match="is not a Slurm option value"):
        load_profile_file(path)


def test_def_text_cannot_start_a_section(tmp_path):
    from hpcdl.container.spec import parse_spec

    spec = Path("containers/pytorch-horovod-cpu.yaml").read_text()
    with pytest.raises(ConfigError, match="no word may start with %"):
        parse_spec(spec + "\ntest: ['echo %post']\n")
    parse_spec(spec + "\ntest: ['echo 50%']\n")  # a % inside a word is fine


def test_deeply_nested_yaml_is_one_line(tmp_path):
    deep = tmp_path / "deep.yaml"
    deep.write_text("name: " + "[" * 50000 + "]" * 50000 + "\n")
    result = invoke("profiles", "validate", str(deep))
    assert result.exit_code == 2
    assert one_error_line(result) == f"error: {deep}: YAML nested too deeply to be a profile"
