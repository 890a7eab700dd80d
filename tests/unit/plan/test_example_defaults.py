"""A profile's defaults for the bundled example (``examples:``): validated at load time,
put on the example's command line before the user's -X (which replaces them option by
option), shown by --dry-run, and applied by `hpcdl scale` the same way."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcdl.cli import cli
from hpcdl.errors import ConfigError
from hpcdl.plan import DEFAULT_EXAMPLE, JobPlan, JobRequest, build_plan, example_defaults
from hpcdl.profiles import load_profile, load_profile_file
from hpcdl.profiles.schema import Examples, Profile

# What scripts/demo.sh passed as -X before the sandbox profile carried them.
DEMO_ARGS = ("--image-size=32", "--batch-size=4", "--max-steps=10", "--epochs=2", "--lr=0.002")

MINIMAL = """\
name: mini
partitions:
  - {name: p1, nodes: 2, gpus_per_node: 4, cpus_per_node: 8, max_time: "01:00:00"}
"""


def profile_with(examples: dict) -> Profile:
    data = {"name": "mini", "partitions": [{"name": "p1", "nodes": 2, "gpus_per_node": 4,
                                            "cpus_per_node": 8, "max_time": "01:00:00"}],
            "examples": examples}
    return Profile.model_validate(data)


def example_argv(plan: JobPlan) -> list[str]:
    """The bundled example's arguments on the launch line, after the script's path."""
    argv = shlex.split(plan.launch.launch_line)
    return argv[next(i for i, a in enumerate(argv) if a.endswith(DEFAULT_EXAMPLE)) + 1:]


@pytest.fixture(scope="module")
def sandbox() -> Profile:
    return load_profile("sandbox")


# --- schema ---------------------------------------------------------------------------

def test_sandbox_carries_the_demo_sizes_for_the_resnet_example(sandbox):
    args = sandbox.examples.per_example[DEFAULT_EXAMPLE]
    assert set(DEMO_ARGS) <= set(args)
    assert "--threads=1" in args and "--workers=0" in args
    assert sandbox.examples.args == []


@pytest.mark.parametrize("name", ["generic", "karolina", "neuron", "polaris", "taurus"])
def test_real_clusters_keep_the_examples_own_defaults(name):
    prof = load_profile(name)
    assert prof.examples == Examples()
    assert build_plan(prof, JobRequest.of(nodes=1, gpus=1)).launch.example_defaults == ()


@pytest.mark.parametrize("bad, needle", [
    ("--epochs 2", "is not an example argument ('--option' or '--option=value', no spaces)"),
    ("epochs=2", "is not an example argument ('--option' or '--option=value', no spaces)"),
    ("-e", "is not an example argument ('--option' or '--option=value', no spaces)"),
    ("--lr=0.1\n--arch=resnet18", "control character"),
    ("--note=a b", "is not an example argument ('--option' or '--option=value', no spaces)"),
    ("--x=$(reboot)\t", "control character"),
    ("--backend=ddp", "--backend is set by hpcdl itself"),
    ("--data=/imagenet", "--data is set by hpcdl itself"),
    ("--synthetic", "--synthetic is set by hpcdl itself"),
    ("--checkpoint-dir=", "--checkpoint-dir is set by hpcdl itself"),
])
def test_a_default_that_is_not_one_option_token_is_refused(tmp_path, bad, needle):
    for section in (f"  args: [{json.dumps(bad)}]\n",
                    f"  per_example:\n    {DEFAULT_EXAMPLE}: [{json.dumps(bad)}]\n"):
        path = tmp_path / "p.yaml"
        path.write_text(MINIMAL + "examples:\n" + section)
        with pytest.raises(ConfigError) as err:
            load_profile_file(path)
        assert str(path) in err.value.message and "examples." in err.value.message
        assert needle in err.value.message


def test_unknown_example_and_unknown_key_are_refused_with_the_valid_ones(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(MINIMAL + "examples:\n  per_example:\n    resnet50.py: [--lr=1]\n")
    with pytest.raises(ConfigError) as err:
        load_profile_file(path)
    assert "'resnet50.py' is not a bundled example" in err.value.message
    assert "resnet50_imagenet.py" in err.value.message
    path.write_text(MINIMAL + "examples:\n  arg: [--lr=1]\n")
    with pytest.raises(ConfigError) as err:
        load_profile_file(path)
    assert "unknown key 'examples.arg'" in err.value.message
    assert "args, per_example" in err.value.message


def test_valid_forms_load(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(MINIMAL + "examples:\n  args: [--amp=off, --zero-init-residual]\n"
                    f"  per_example:\n    {DEFAULT_EXAMPLE}: [--checkpoint-every=50, --wd=1e-4]\n")
    prof = load_profile_file(path)
    assert prof.examples.args == ["--amp=off", "--zero-init-residual"]
    assert prof.examples.per_example[DEFAULT_EXAMPLE] == ["--checkpoint-every=50", "--wd=1e-4"]


# --- plan -----------------------------------------------------------------------------

def test_headline_request_gets_the_sandbox_defaults(sandbox):
    plan = build_plan(sandbox, JobRequest.of(nodes=2, gpus=4, image="/scratch/img.sif"))
    assert plan.launch.example_defaults == tuple(sandbox.examples.per_example[DEFAULT_EXAMPLE])
    argv = example_argv(plan)
    assert argv[:3] == ["--backend", "horovod", "--synthetic"]
    assert argv[3:] == list(plan.launch.example_defaults)
    assert plan.to_dict()["example_defaults"] == list(plan.launch.example_defaults)
    assert list(plan.launch.command[-len(plan.launch.example_defaults):]) == list(plan.launch.example_defaults)


def test_a_user_x_replaces_the_default_for_the_same_option(sandbox):
    req = JobRequest.of(nodes=2, gpus=4, example_args=("--max-steps=3", "--arch=resnet18",
                                                    "--batch-size", "8"))
    plan = build_plan(sandbox, req)
    argv = example_argv(plan)
    # Each option once, with the user's value: no "--max-steps=10 ... --max-steps=3".
    assert [a for a in argv if a.startswith("--max-steps")] == ["--max-steps=3"]
    assert [a for a in argv if a.startswith("--batch-size")] == ["--batch-size"]
    assert argv[argv.index("--batch-size") + 1] == "8"
    assert "--max-steps=10" not in plan.launch.example_defaults
    assert "--batch-size=4" not in plan.launch.example_defaults
    assert "--image-size=32" in plan.launch.example_defaults
    # The user's arguments come last, so argparse ("the last one wins") agrees too.
    assert argv[-4:] == ["--max-steps=3", "--arch=resnet18", "--batch-size", "8"]


def test_the_example_really_takes_the_users_value(sandbox, monkeypatch):
    """The command line as the example's own parser reads it."""
    import sys

    from hpcdl.core.resources import examples_dir

    monkeypatch.syspath_prepend(str(examples_dir()))
    sys.modules.pop("resnet50_imagenet", None)
    import resnet50_imagenet

    plan = build_plan(sandbox, JobRequest.of(nodes=2, gpus=4, example_args=(
        "--max-steps=3", "--image-size", "64", "--workers=1")))
    args = resnet50_imagenet.parse_args(example_argv(plan))
    assert (args.max_steps, args.image_size, args.workers) == (3, 64, 1)
    assert (args.batch_size, args.epochs, args.threads, args.num_classes) == (4, 2, 1, 10)
    assert args.synthetic and args.backend == "horovod"
    plain = resnet50_imagenet.parse_args(example_argv(build_plan(sandbox, JobRequest.of(
        nodes=2, gpus=4))))
    assert (plain.max_steps, plain.image_size, plain.batch_size, plain.lr) == (10, 32, 4, 0.002)


def test_per_example_replaces_args_and_x_replaces_both():
    prof = profile_with({"args": ["--lr=0.1", "--epochs=3", "--zero-init-residual"],
                         "per_example": {DEFAULT_EXAMPLE: ["--lr=0.2", "--max-steps=5"]}})
    assert example_defaults(prof, JobRequest.of().launch) == (
        "--epochs=3", "--zero-init-residual", "--lr=0.2", "--max-steps=5")
    # A flag default goes away when -X names it (argparse alone could not undo it).
    req = JobRequest.of(example_args=("--zero-init-residual", "--lr=0.3"))
    assert example_defaults(prof, req.launch) == ("--epochs=3", "--max-steps=5")
    assert example_argv(build_plan(prof, req))[-4:] == [
        "--epochs=3", "--max-steps=5", "--zero-init-residual", "--lr=0.3"]


def test_defaults_follow_data_and_run_dir_and_skip_a_command(sandbox):
    plan = build_plan(sandbox, JobRequest.of(nodes=1, gpus=1, data="/scratch/d", run_dir="/scratch/runs/r"))
    argv = example_argv(plan)
    assert argv[:6] == ["--backend", "horovod", "--data", "/scratch/d", "--checkpoint-dir",
                        "/scratch/runs/r/checkpoints"]
    assert argv[6:] == list(plan.launch.example_defaults)
    cmd = build_plan(sandbox, JobRequest.of(nodes=1, gpus=1, command=("python3", "t.py")))
    assert cmd.launch.example_defaults == () and cmd.launch.command == ("python3", "t.py")


# --- CLI ------------------------------------------------------------------------------

def test_dry_run_shows_the_defaults_and_where_they_come_from(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(cli, ["submit", "-p", "sandbox", "--nodes", "2", "--gpus", "4",
                                   "--image", "/scratch/img.sif", "--dry-run", "-X", "--max-steps=3"])
    assert res.exit_code == 0, res.output
    header = [ln for ln in res.stderr.splitlines() if "example defaults" in ln]
    assert len(header) == 1
    assert header[0].startswith("# example defaults from profile sandbox: --image-size=32 ")
    assert "--max-steps" not in header[0]
    assert "(a -X for the same option replaces one)" in header[0]
    launch = next(ln for ln in res.stdout.splitlines() if ln.startswith("srun "))
    assert launch.endswith("--num-classes=10 --max-steps=3")
    assert "--max-steps=10" not in launch
    assert not list(tmp_path.iterdir())  # a dry run writes nothing


def test_dry_run_json_and_a_profile_without_defaults():
    res = CliRunner().invoke(cli, ["submit", "-p", "sandbox", "-N", "2", "-G", "4", "--dry-run",
                                   "--json"])
    assert res.exit_code == 0, res.output
    plan = json.loads(res.stdout)
    assert "--batch-size=4" in plan["example_defaults"]
    assert "--batch-size=4" in plan["command"]
    res = CliRunner().invoke(cli, ["submit", "-p", "neuron", "-N", "2", "-G", "4", "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "example defaults" not in res.stderr


def test_help_says_x_replaces_the_profile_default():
    res = CliRunner().invoke(cli, ["submit", "--help"])
    assert "Replaces the profile's default for the same option" in " ".join(res.output.split())


def test_profiles_show_lists_the_defaults():
    res = CliRunner().invoke(cli, ["profiles", "show", "sandbox"])
    assert res.exit_code == 0, res.output
    assert f"  {DEFAULT_EXAMPLE} defaults: --image-size=32 --batch-size=4" in res.output


def test_scale_applies_the_defaults_and_its_batch_size_wins(tmp_path: Path):
    res = CliRunner().invoke(cli, ["scale", "-p", "sandbox", "-N", "1,2", "-G", "1,2",
                                   "--batch-size", "8,16", "--dry-run", "--json"])
    assert res.exit_code == 0, res.output
    points = json.loads(res.stdout)["points"]
    assert len(points) == 8
    for point in points:
        command = point["plan"]["command"]
        assert [a for a in command if a.startswith("--batch-size")] == [
            f"--batch-size={point['batch_size']}"]
        assert command[-1] == f"--batch-size={point['batch_size']}"
        assert "--image-size=32" in command and "--max-steps=10" in command
        assert "--batch-size=4" not in point["plan"]["example_defaults"]
    text = CliRunner().invoke(cli, ["scale", "-p", "sandbox", "-N", "1", "-G", "1", "--dry-run",
                                    "-X", "--max-steps=40"])
    assert text.exit_code == 0, text.output
    assert "example defaults from profile sandbox: --image-size=32 --batch-size=4 " in text.stdout
    each = next(ln for ln in text.stdout.splitlines() if "each runs:" in ln)
    assert each.endswith("--max-steps=40") and "--max-steps=10" not in each
