"""What the host's pip and curl trust, passed to a build: its CA bundle and its proxies.

Behind a TLS-intercepting proxy the host trusts the proxy's CA (pip's ``cert``,
``PIP_CERT``, ``REQUESTS_CA_BUNDLE``, ...), but a build's ``%post`` runs the image's pip
with the image's (or certifi's) CA list, and ``pip install`` fails with
CERTIFICATE_VERIFY_FAILED. Apptainer passes neither the host's environment nor its
files into ``%post``, so ``hpcdl build`` does, for every kind of recipe (spec, .def,
Dockerfile), without touching the definition:

- the CA bundle is copied into the build's own temporary folder and bound read-only at
  ``/mnt`` (``--bind DIR:/mnt:ro``; a bind destination must exist in the image, and
  ``/mnt`` does in every distribution's base). It is there for ``%post`` and ``%test``
  only: the image keeps its own (empty) ``/mnt``;
- ``PIP_CERT``, ``REQUESTS_CA_BUNDLE``, ``SSL_CERT_FILE``, ``CURL_CA_BUNDLE`` and
  ``GIT_SSL_CAINFO`` point at it, and the host's proxy variables are passed as they are,
  through ``APPTAINERENV_<NAME>`` (Apptainer's build has no ``--env``); these reach the
  build's processes, not the image's ``%environment``.

``discover`` is pure (the environment and the pip configuration come in as values);
``host_trust`` reads this host's.
"""

from __future__ import annotations

import configparser
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcdl.errors import UserInputError

# Variables that tell pip, requests, OpenSSL (python's ssl, wget), curl and git which CAs
# to trust; inside the build each points at the bound copy of the host's bundle.
CA_ENV = ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO")
# Where the host's own tools look, in the order pip itself decides (its environment
# variable, then its configuration), then what requests/OpenSSL/curl read.
CA_SOURCES_ENV = ("REQUESTS_CA_BUNDLE", "SSL_CERT_FILE", "CURL_CA_BUNDLE")
SYSTEM_BUNDLES = (
    "/etc/ssl/certs/ca-certificates.crt",  # Debian, Ubuntu, Alpine
    "/etc/pki/tls/certs/ca-bundle.crt",  # RHEL, Rocky, Fedora
    "/etc/ssl/ca-bundle.pem",  # SUSE
    "/etc/ssl/cert.pem",  # Arch, macOS
)
PROXY_ENV = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY",
             "all_proxy", "NO_PROXY", "no_proxy")
MOUNT = "/mnt"  # exists in every base image: a bind destination must
CA_NAME = "hpcdl-host-ca.crt"
CA_IN_BUILD = f"{MOUNT}/{CA_NAME}"
BAKED_CA = "/etc/hpcdl/host-ca.crt"  # where --bake-ca puts it, for good
# A proxy URL: scheme://[user[:password]@]host[:port][/], or host:port. No space, quote,
# backslash or control character (they would reach pip's and curl's parsers).
_PROXY = re.compile(r"(?:[A-Za-z][A-Za-z0-9+.-]*://)?(?:[^\s@/'\"`\\]+@)?[A-Za-z0-9.\-\[\]:_]+/?")
# NO_PROXY: host names, domains (.example.org), addresses, CIDRs, '*', comma-separated.
_NO_PROXY = re.compile(r"[A-Za-z0-9.\-\[\]:_/*, ]*")
# Apptainer's --bind splits on ':' and ','.
_BIND_SAFE = re.compile(r"/[^:,\s]*")


@dataclass(frozen=True)
class HostTrust:
    """The CA bundle and proxies a build gets from the host (None/empty: nothing)."""

    ca_bundle: str | None = None
    ca_from: str = ""  # where it was found: "PIP_CERT", "pip config /etc/pip.conf [global] cert"
    proxies: tuple[tuple[str, str], ...] = ()
    notes: tuple[str, ...] = field(default=(), compare=False)  # what was skipped, and why

    @property
    def empty(self) -> bool:
        return self.ca_bundle is None and not self.proxies

    def build_env(self) -> dict[str, str]:
        """The ``APPTAINERENV_*`` variables for ``apptainer build`` (true values)."""
        env = {f"APPTAINERENV_{name}": CA_IN_BUILD for name in CA_ENV} if self.ca_bundle else {}
        env.update({f"APPTAINERENV_{name}": value for name, value in self.proxies})
        return env

    def shown_env(self) -> dict[str, str]:
        """``build_env`` with every proxy password replaced (for --dry-run and logs)."""
        return {k: redact(v) for k, v in self.build_env().items()}

    def bind(self, staged_dir: str | Path) -> list[str]:
        """``--bind DIR:/mnt:ro`` for the folder holding the staged copy, or [].
        Raises UserInputError for a folder Apptainer's bind syntax cannot carry."""
        if not self.ca_bundle:
            return []
        src = str(staged_dir)
        if not src.startswith("<") and not _BIND_SAFE.fullmatch(src):
            raise UserInputError(
                f"build: the build folder {src!r} has ':' ',' or a space, which --bind cannot "
                "carry", hint="choose an output (-o) in another folder, or --no-host-trust")
        return ["--bind", f"{src}:{MOUNT}:ro"]

    def summary(self) -> str:
        """One line for --dry-run and the build log (no proxy password)."""
        parts = []
        if self.ca_bundle:
            parts.append(f"CA bundle {self.ca_bundle} (from {self.ca_from}) bound at "
                         f"{CA_IN_BUILD} for %post and %test, not kept in the image")
        else:
            parts.append("no CA bundle found")
        if self.proxies:
            parts.append("proxies " + " ".join(f"{k}={redact(v)}" for k, v in self.proxies))
        return "; ".join(parts + list(self.notes))

    def to_dict(self) -> dict[str, Any]:
        return {"ca_bundle": self.ca_bundle, "ca_from": self.ca_from or None,
                "bound_at": CA_IN_BUILD if self.ca_bundle else None,
                "env": self.shown_env(), "notes": list(self.notes)}


def bake_sections(ca_bundle: str) -> str:
    """``%files`` + ``%environment`` sections that keep ``ca_bundle`` in the image at
    BAKED_CA and point the CA variables at it (--bake-ca: for images that will run
    behind the same proxy). Apptainer appends repeated sections to the first ones.
    Raises UserInputError for a path %files cannot carry."""
    if not re.fullmatch(r"/[^\s]+", ca_bundle):
        raise UserInputError(f"bake-ca: {ca_bundle!r} is not an absolute path without spaces")
    exports = " ".join(f"{name}={BAKED_CA}" for name in CA_ENV)
    return (f"\n%files\n    {ca_bundle} {BAKED_CA}\n"
            f"\n%environment\n    export {exports}\n")


def redact(value: str) -> str:
    """``http://user:secret@proxy:3128`` -> ``http://***@proxy:3128``; anything else as is.
    Pure."""
    return re.sub(r"^((?:[A-Za-z][A-Za-z0-9+.-]*://)?)[^\s@/]+@", r"\1***@", value)


def pip_config_files(env: Mapping[str, str], home: str, prefix: str = sys.prefix) -> list[str]:
    """pip's configuration files, in the order pip reads them (a later one wins): global
    (``$XDG_CONFIG_DIRS``/pip/pip.conf, /etc/pip.conf), user (~/.pip/pip.conf,
    ``$XDG_CONFIG_HOME``/pip/pip.conf), site (``sys.prefix``/pip.conf), then
    ``$PIP_CONFIG_FILE``. Pure."""
    if env.get("PIP_CONFIG_FILE") == os.devnull:
        return []
    dirs = (env.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(":")
    files = [f"{d}/pip/pip.conf" for d in reversed(dirs) if d] + ["/etc/pip.conf"]
    config_home = env.get("XDG_CONFIG_HOME") or f"{home}/.config"
    files += [f"{home}/.pip/pip.conf", f"{config_home}/pip/pip.conf", f"{prefix}/pip.conf"]
    if env.get("PIP_CONFIG_FILE"):
        files.append(env["PIP_CONFIG_FILE"])
    return list(dict.fromkeys(files))


def read_pip_configs(paths: Sequence[str]) -> list[tuple[str, dict[str, dict[str, str]]]]:
    """(path, {section: {key: value}}) of each readable pip configuration file."""
    out: list[tuple[str, dict[str, dict[str, str]]]] = []
    for path in paths:
        parser = configparser.RawConfigParser()
        try:
            if not parser.read(path):
                continue
        except (configparser.Error, OSError, UnicodeDecodeError):
            continue
        out.append((path, {s: dict(parser.items(s)) for s in parser.sections()}))
    return out


def discover(env: Mapping[str, str],
             pip_configs: Sequence[tuple[str, Mapping[str, Mapping[str, str]]]],
             exists: Callable[[str], bool],
             ca_bundle: str | None = None) -> HostTrust:
    """The CA bundle and proxies a build should get. Pure: the environment, pip's parsed
    configuration files (in pip's order) and a file test come in as values.

    CA, first found that exists: ``ca_bundle`` (an explicit choice), ``PIP_CERT``, pip's
    ``cert`` (the last file that sets it; ``[install]`` over ``[global]``),
    ``REQUESTS_CA_BUNDLE``, ``SSL_CERT_FILE``, ``CURL_CA_BUNDLE``, the system bundle.
    Raises UserInputError for an explicit ``ca_bundle`` that does not exist, or a proxy
    variable that is not a proxy URL (its value is not shown: it may hold a password).
    """
    notes: list[str] = []
    candidates: list[tuple[str, str]] = []
    if ca_bundle is not None:
        if not exists(ca_bundle):
            raise UserInputError(f"ca-bundle: {ca_bundle!r} is not a file")
        candidates.append((ca_bundle, "--ca-bundle"))
    if env.get("PIP_CERT"):
        candidates.append((env["PIP_CERT"], "PIP_CERT"))
    for path, sections in reversed(pip_configs):
        value = (sections.get("install") or {}).get("cert") or (sections.get("global") or {}).get("cert")
        if value:
            section = "install" if (sections.get("install") or {}).get("cert") else "global"
            candidates.append((value, f"pip config {path} [{section}] cert"))
            break
    candidates += [(env[name], name) for name in CA_SOURCES_ENV if env.get(name)]
    candidates += [(path, "the system bundle") for path in SYSTEM_BUNDLES]
    chosen: tuple[str, str] | None = None
    for path, origin in candidates:
        if exists(path):
            chosen = (path, origin)
            break
        if origin != "the system bundle":
            notes.append(f"{origin} names {path}, which does not exist")
    proxies: list[tuple[str, str]] = []
    for name in PROXY_ENV:
        value = env.get(name)
        if not value:
            continue
        pattern = _NO_PROXY if name.lower() == "no_proxy" else _PROXY
        if not pattern.fullmatch(value):
            raise UserInputError(
                f"build: {name} on this host is not a proxy URL (value not shown)",
                hint=f"fix {name}, or build with --no-host-trust")
        proxies.append((name, value))
    return HostTrust(ca_bundle=chosen[0] if chosen else None,
                     ca_from=chosen[1] if chosen else "", proxies=tuple(proxies),
                     notes=tuple(notes))


def host_trust(ca_bundle: str | None = None) -> HostTrust:
    """``discover`` on this host's environment and pip configuration files."""
    env = dict(os.environ)
    configs = read_pip_configs(pip_config_files(env, str(Path.home())))
    return discover(env, configs, lambda p: Path(p).is_file(), ca_bundle=ca_bundle)
