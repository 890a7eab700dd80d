"""`hpcdl build`: image spec (or definition file) -> Apptainer/Singularity image."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import click

from hpcdl.container.build import (
    COMPRESSIONS,
    BuildPlan,
    BuildResult,
    WheelOptions,
    execute,
    plan_build,
    unprivileged_build,
)
from hpcdl.container.definition import WHEELS_DEST
from hpcdl.container.spec import bundled_spec_names
from hpcdl.container.wheels import Resolution, wheel_names
from hpcdl.errors import UserInputError
from hpcdl.profiles import load_profile


def _default_ref() -> str:
    if Path("Singularity.def").is_file():
        return "Singularity.def"
    raise UserInputError(
        "build: no SPEC or DEF given and no ./Singularity.def "
        f"(bundled specs: {', '.join(bundled_spec_names())})"
    )


def _show_wheels(res: Resolution) -> None:
    """--dry-run: what resolves pip.packages on the host, and how the build gets them."""
    state = (f"resolved ({len(wheel_names(res))} wheels)" if res.resolved
             else "not resolved yet: a build runs")
    click.echo(f"\n# pip.packages for {res.target.describe()} (from {res.target.source}), "
               f"{state}:\n#   {res.shown()}", err=True)
    click.echo(f"# wheelhouse: {res.path} -> {WHEELS_DEST} (%files; pip install --no-index "
               "--find-links, removed in %post)", err=True)


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _profile_binary(profile: str | None) -> str | None:
    if not profile:
        return None
    container = load_profile(profile).container
    return container.binary or container.runtime


@click.command()
@click.argument("ref", metavar="[SPEC|DEF|DOCKERFILE]", required=False)
@click.option("-o", "--output", metavar="IMAGE",
              help="Where the image goes (default: <cache>/images/NAME.sif; the cache is "
                   "${HPCDL_CACHE:-/var/cache/hpcdl} where you may write it, else "
                   "${XDG_CACHE_HOME:-~/.cache}/hpcdl).")
@click.option("--fakeroot", is_flag=True,
              help="Build without root (user namespaces; site must allow it). Implied when "
                   "not run as root.")
@click.option("--sandbox", is_flag=True, help="Build a writable folder instead of a SIF file.")
@click.option("--remote", is_flag=True, help="Build on the configured remote build service.")
@click.option("--force", is_flag=True, help="Rebuild even when the content hash is unchanged.")
@click.option("--profile", "-p", metavar="NAME|PATH",
              help="Use this cluster profile's container runtime binary.")
@click.option("--dry-run", is_flag=True,
              help="Print the definition and the build command; build nothing.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable plan/result.")
@click.option("--verbose", "-v", is_flag=True, help="Show every line of the build output.")
@click.option("--base-image", metavar="PATH",
              help="Dockerfile only: build on this local image (Bootstrap: localimage) instead "
                   "of its FROM (no registry needed).")
@click.option("--host-trust/--no-host-trust", "host", default=True, show_default=True,
              help="Give the build's %post this host's CA bundle (the one its pip trusts: "
                   "PIP_CERT, pip's cert, REQUESTS_CA_BUNDLE, SSL_CERT_FILE, the system "
                   "bundle) bound read-only at /mnt, and its HTTPS_PROXY/HTTP_PROXY/NO_PROXY; "
                   "nothing of it stays in the image.")
@click.option("--ca-bundle", metavar="PATH",
              help="The CA bundle to pass instead of the one found (implies --host-trust).")
@click.option("--bake-ca", is_flag=True,
              help="Also keep that CA bundle in the image (/etc/hpcdl/host-ca.crt, with "
                   "SSL_CERT_FILE and friends in its environment), for images that run "
                   "behind the same proxy.")
@click.option("--import-check/--no-import-check", "import_check", default=True,
              show_default=True,
              help="End the build with a %test that imports torch, torchvision (and runs "
                   "one of its operators), horovod.torch and mpi4py when installed: a "
                   "mismatch fails the build in one line and no image is written.")
@click.option("--offline", is_flag=True,
              help="Resolve the spec's pip.packages on this host (pip download of binary "
                   "wheels for the image's Python and platform, through the host's pip "
                   "configuration) into a wheelhouse kept by content, and install them in "
                   "the build with --no-index: the build needs no network. As "
                   "`pip.resolve: host` in the spec.")
@click.option("--wheelhouse", "wheel_root", metavar="DIR",
              help="Where resolved wheelhouses are kept, one folder per content key "
                   "(default: <cache>/wheelhouses); implies --offline. A folder shared with "
                   "a build node without network lets it build what a connected host resolved.")
@click.option("--resolve-only", is_flag=True,
              help="Resolve pip.packages on this host (as --offline) and stop: on a connected "
                   "host, before `--offline --wheelhouse DIR` on a build node without network.")
@click.option("--compression", type=click.Choice(COMPRESSIONS), default=None,
              help="The SIF's squashfs compression (mksquashfs -comp), part of the content "
                   "hash. Default: lz4 for a Dockerfile or .def (builds in a fraction of "
                   "gzip's time, starts as fast, is larger); a spec's own `compression`, "
                   "else the runtime's gzip. gzip: the smallest SIF every kernel reads.")
def build(ref: str | None, output: str | None, fakeroot: bool, sandbox: bool, remote: bool,
          force: bool, profile: str | None, dry_run: bool, as_json: bool, verbose: bool,
          base_image: str | None, host: bool, ca_bundle: str | None,
          import_check: bool, bake_ca: bool, offline: bool, wheel_root: str | None,
          resolve_only: bool, compression: str | None) -> None:
    """Build an image from a spec (containers/NAME.yaml or a bundled NAME), a .def file,
    or a Dockerfile.

    The spec is rendered through templates/singularity.def.j2 and built with apptainer
    (or singularity) into a temporary file beside the target, renamed into place only
    when the build and its %test succeed: a failed or interrupted build leaves the
    previous image untouched. The full log goes to IMAGE.build.log, the rendered
    definition to IMAGE.def, and a content hash of the definition and every file copied
    in to IMAGE.hash: rebuilding an unchanged spec is a no-op (--force rebuilds).

    A Dockerfile is converted with spython's Docker -> Singularity writer (--dry-run
    shows the result); its COPY sources are read from its folder, and the image is
    named after that folder. Its base comes from a registry unless it says
    `FROM localimage:/path/base.sif` or --base-image gives a local image.

    Behind a TLS-intercepting proxy, `pip install` in %post (a Dockerfile's RUN) works
    as on the host: the CA bundle the host's pip trusts is bound for the build and
    PIP_CERT, REQUESTS_CA_BUNDLE, SSL_CERT_FILE, CURL_CA_BUNDLE point at it, with the
    host's proxy variables (--dry-run shows them, proxy passwords hidden). The image
    keeps its own CA list.

    Offline (--offline, or `pip.resolve: host` in the spec): the spec's pip.packages are
    downloaded on this host as binary wheels for the image's Python and platform (read
    from a localimage base, the debootstrap release, or the spec's pip.target) into
    <cache>/wheelhouses/KEY, reused while the requirements, indexes and target are the
    same, copied into the build and installed with --no-index. A package with no wheel
    for that platform stops the build before it starts (exit 2).

    \b
    Examples:
      hpcdl build pytorch-horovod-cpu              # buildable without a registry
      hpcdl build pytorch-horovod-gpu --fakeroot   # on a cluster login node
      hpcdl build my.def -o my.sif --dry-run
      hpcdl build ./Dockerfile --base-image base.sif --dry-run
      hpcdl build my-spec.yaml --offline --dry-run  # shows the pip download
    """
    binary = _profile_binary(profile)
    wheels = WheelOptions(offline=offline or resolve_only or wheel_root is not None,
                          root=wheel_root, resolve=not dry_run, binary=binary)
    plan = plan_build(ref or _default_ref(), output=output, sandbox=sandbox, fakeroot=fakeroot,
                      remote=remote, force=force, base_image=base_image,
                      host=host or ca_bundle is not None, ca_bundle=ca_bundle,
                      import_check=import_check, bake_ca=bake_ca, wheels=wheels,
                      compression=compression)
    if resolve_only:
        click.echo(resolved_text(plan, as_json))
    elif dry_run:
        _show_dry_run(plan, as_json)
    else:
        on_line = None if as_json else _progress(verbose)  # its clock starts here
        if not plan.up_to_date or force:
            _announce(plan, force=force, ordinary_user=os.geteuid() != 0 and not remote,
                      binary=binary)
        result = _execute(plan, binary, on_line)
        click.echo(result_text(plan, result, as_json))


def resolved_text(plan: BuildPlan, as_json: bool) -> str:
    """--resolve-only's answer: the resolved wheelhouse, or that there is nothing to
    resolve. Pure."""
    res = plan.wheels
    if as_json:
        return json.dumps({"wheels": res.to_dict() if res else None}, indent=2)
    if res is None:
        return f"{plan.source}: no pip.packages to resolve"
    return f"resolved {len(wheel_names(res))} wheels for {res.target.describe()} in {res.path}"


def _show_dry_run(plan: BuildPlan, as_json: bool) -> None:
    """The definition on stdout (or the whole plan as JSON); the command, the host
    trust and whether it would build on stderr, so that stdout is a usable .def file."""
    if as_json:
        click.echo(json.dumps({**plan.to_dict(), "definition": plan.definition}, indent=2))
        return
    click.echo(plan.definition, nl=False)
    if plan.wheels:
        _show_wheels(plan.wheels)
    click.echo(f"\n# build: {plan.shown_command()}", err=True)
    if plan.trust:
        click.echo(f"# host trust: {plan.trust.summary()}", err=True)
    state = ("up to date (no-op; --force rebuilds)" if plan.up_to_date
             else "would build: " + "; ".join(plan.reasons))
    click.echo(f"# {plan.output}: {state}; content hash {plan.content_hash[:16]}", err=True)


def _announce(plan: BuildPlan, *, force: bool, ordinary_user: bool, binary: str | None) -> None:
    """Before a build: how an ordinary user builds here, where it goes, and why."""
    if ordinary_user:
        click.echo(f"as an ordinary user: {unprivileged_build(binary)}", err=True)
    click.echo(f"building {plan.name} -> {plan.output} (log: {plan.log_path})", err=True)
    why = ["--force"] if plan.up_to_date and force else list(plan.reasons)
    if why:
        click.echo("  because: " + "; ".join(why), err=True)


def _progress(verbose: bool) -> Callable[[str], None]:
    """The build's lines on stderr, with the seconds since the build started."""
    start = time.monotonic()

    def progress(line: str) -> None:
        # Apptainer's own INFO/WARNING lines mark the stages; the rest only with -v.
        text = line.rstrip()
        if verbose or text.startswith(("INFO:", "WARNING:", "FATAL:", "ERROR:")):
            click.echo(f"[{time.monotonic() - start:6.0f}s] {text}", err=True)

    return progress


def _execute(plan: BuildPlan, binary: str | None,
             on_line: Callable[[str], None] | None) -> BuildResult:
    # SIGTERM (scancel, kill, CI timeouts) must unwind like Ctrl-C, so the build child is
    # killed and the temporary image removed; Python's default would just exit.
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        return execute(plan, binary=binary, on_line=on_line)
    finally:
        signal.signal(signal.SIGTERM, previous)


def result_text(plan: BuildPlan, result: BuildResult, as_json: bool) -> str:
    """What `hpcdl build` says at the end: built (where, how long, how big, the import
    check), or up to date; with --json the plan and the result. Pure but for the image's
    size, read from the file."""
    if as_json:
        return json.dumps({**plan.to_dict(), "built": result.built,
                           "seconds": round(result.seconds, 1),
                           "import_check_result": result.import_check.message
                           if result.import_check else None}, indent=2)
    if not result.built:
        return (f"{result.image} is up to date (content hash {result.content_hash[:16]}); "
                "--force rebuilds")
    size = result.image.stat().st_size if result.image.is_file() else 0
    return (f"built {result.image} in {result.seconds:.0f} s"
            + (f" ({size / 2**20:.0f} MiB)" if size else "")
            + (f"\nimport check: {result.import_check.message}" if result.import_check else ""))
