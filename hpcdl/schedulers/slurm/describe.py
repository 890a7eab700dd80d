"""A cluster profile written from what the live Slurm says (``hpcdl profiles detect``).

``describe(facts)`` turns the facts ``detect`` read (ClusterFacts) into a profile whose every
value carries a comment saying where it came from, and ``to_yaml`` writes it. The
writer is a tiny emitter of its own (not yaml.dump) so the comments can sit beside
the values; every string is written double-quoted in ASCII (YAML escapes for the rest), every
comment is one line, and the text is parsed back and validated with the profile
schema before anyone sees it: a profile feeds job scripts.

Rules for what a request may ask (the profile holds one number per partition):
a heterogeneous partition is described by its smallest node (fewest GPUs, CPUs,
memory), because hpcdl cannot know which node Slurm will pick, and the comment says
so. Nodes that are down still count: Slurm accepts (and queues) jobs that need them.

Detected through a login node (``--login``), the profile gets a ``login:`` block, so it
works from where it was detected; the container runtime found is the login node's, and
how the compute nodes run it (``container.mode``) is left for the user to say.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Union

import pydantic

from hpcdl.core.duration import format_time, parse_time
from hpcdl.core.yamlmodel import describe_validation_error, parse_yaml_model
from hpcdl.errors import ConfigError, ToolError, ValidationError
from hpcdl.profiles.schema import Login, Partition, Profile
from hpcdl.schedulers.slurm import releases
from hpcdl.schedulers.slurm.detect import ClusterFacts, Node, PartitionInfo

_NAME_BAD = re.compile(r"[^A-Za-z0-9_.\-]+")
# Out of a comment: what YAML reads as a line break (\x85, \u2028, \u2029: a comment
# would end there and the rest be read as a key) or refuses in a file (C0/C1 controls,
# lone surrogates, \ufffe/\uffff). A node's Reason= is whatever its admin typed.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff\ufffe\uffff]")
SCONTROL_PART = "scontrol show partition"
SCONTROL_NODE = "scontrol show node"
SCONTROL_CONFIG = "scontrol show config"
NOT_DETECTED = ("modules, env vars, container binds, paths, account/qos to charge, "
                "python, defaults for the bundled examples: not in Slurm; add them by hand")


@dataclass(frozen=True)
class Leaf:
    """A scalar value and the comment saying where it came from."""

    value: Any
    comment: str = ""


@dataclass(frozen=True)
class Map:
    items: tuple[tuple[str, Value], ...]
    comment: str = ""


@dataclass(frozen=True)
class Seq:
    """A list of mappings (partitions) or of scalars (written inline)."""

    items: tuple[Value, ...]
    comment: str = ""


Value = Union[Leaf, Map, Seq]  # noqa: UP007 (an alias the classes above refer to by name)


@dataclass(frozen=True)
class Detected:
    """The detected profile: the validated model, its YAML text, and the caveats."""

    profile: Profile
    text: str
    notes: tuple[str, ...]


def _comment(text: str) -> str:
    return _CONTROL.sub(" ", text).strip()


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return _quoted(value)
    raise TypeError(f"cannot write {type(value).__name__} to a profile")


def _quoted(text: str) -> str:
    """A YAML double-quoted scalar of ASCII only: every other character escaped. Not
    json.dumps: JSON writes a character beyond U+FFFF as a surrogate pair, which YAML
    reads back as two lone surrogates (\\U........ is YAML's escape for it)."""
    out = []
    for ch in text:
        code = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif 0x20 <= code < 0x7F:
            out.append(ch)
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return '"' + "".join(out) + '"'


def _line(prefix: str, body: str, comment: str) -> str:
    comment = _comment(comment)
    return f"{prefix}{body}  # {comment}" if comment else f"{prefix}{body}"


def _emit(node: Map, indent: int, first_prefix: str | None = None) -> list[str]:
    lines: list[str] = []
    pad = " " * indent
    for i, (key, child) in enumerate(node.items):
        prefix = first_prefix if (i == 0 and first_prefix is not None) else pad
        if isinstance(child, Leaf):
            lines.append(_line(prefix, f"{key}: {_scalar(child.value)}", child.comment))
        elif isinstance(child, Map):
            lines.append(_line(prefix, f"{key}:", child.comment))
            lines += _emit(child, indent + 2)
        elif all(isinstance(x, Leaf) for x in child.items):
            inline = ", ".join(_scalar(x.value) for x in child.items if isinstance(x, Leaf))
            lines.append(_line(prefix, f"{key}: [{inline}]", child.comment))
        else:
            lines.append(_line(prefix, f"{key}:", child.comment))
            for item in child.items:
                assert isinstance(item, Map)
                lines += _emit(item, indent + 4, first_prefix=" " * (indent + 2) + "- ")
    return lines


def _data(node: Value) -> Any:
    if isinstance(node, Leaf):
        return node.value
    if isinstance(node, Map):
        return {k: _data(v) for k, v in node.items}
    return [_data(x) for x in node.items]


def to_yaml(doc: Map, header: Sequence[str]) -> str:
    """The document as YAML text: ``header`` as comment lines, then the values. Pure."""
    lines = [f"# {_comment(h)}" if h else "#" for h in header]
    return "\n".join([*lines, *_emit(doc, 0)]) + "\n"


# ---- from the cluster's facts to a profile ---------------------------------------------


def profile_name(facts: ClusterFacts, name: str | None) -> str:
    """The profile's name: ``name``, else Slurm's ClusterName made into a valid name."""
    if name:
        return name
    cleaned = _NAME_BAD.sub("-", facts.cluster_name or "").strip("-.")
    return cleaned or "detected"


def _time(text: str) -> str:
    return format_time(parse_time(text))


def _names(names: list[str], most: int = 3) -> str:
    """'g1, g2' or 'f1, f2, f3 and 2043 more': a comment stays readable on big clusters."""
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def _hetero(values: dict[str, int], unit: str) -> str:
    """'4 on every node' or 'heterogeneous (2: g2; 4: g1): the smallest node decides'."""
    groups: dict[int, list[str]] = {}
    for node, value in values.items():
        groups.setdefault(value, []).append(node)
    if len(groups) <= 1:
        return f"{next(iter(groups), 0)}{unit} on every node"
    shown = "; ".join(f"{v}{unit}: {_names(ns)}" for v, ns in sorted(groups.items()))
    return f"heterogeneous ({shown}): the smallest node decides what a request may ask"


def _gpu_type(nodes: list[Node]) -> tuple[str | None, str]:
    types = {n.name: n.gpu_types for n in nodes}
    with_gpus = {n: t for n, t in types.items() if t}
    if not with_gpus:
        return None, "no GPU GRES on any node"
    kinds = sorted({t for ts in with_gpus.values() for t in ts})
    if len(kinds) == 1 and len(with_gpus) == len(nodes) and kinds[0] != "untyped":
        return kinds[0], f"GRES type of every node ({SCONTROL_NODE} Gres=)"
    groups: dict[str, list[str]] = {}
    for node, kinds_of in types.items():
        groups.setdefault("+".join(kinds_of) or "none", []).append(node)
    shown = "; ".join(f"{k}: {_names(ns)}" for k, ns in sorted(groups.items()))
    return None, f"GPU types differ ({shown}): a request cannot pick one node kind"


def _unusable(nodes: list[Node]) -> str:
    bad = [n for n in nodes if not n.usable]
    if not bad:
        return "all usable now"
    shown = ", ".join(f"{n.name} {n.state}" + (f" ({n.reason})" if n.reason else "") for n in bad[:3])
    more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
    return f"{len(bad)} not usable now: {shown}{more}; Slurm still queues jobs that need them"


def _qos_limits(facts: ClusterFacts, part: PartitionInfo) -> tuple[Leaf, Leaf]:
    """max_jobs_per_user and max_gpus_per_user from the partition's QOS (else 'normal')."""
    if facts.qos is None:
        why = f"GAP: per-user limits unknown: sacctmgr show qos failed ({facts.gaps.get('qos', 'not asked')})"
        return Leaf(None, why), Leaf(None, why)
    qos_name = part.qos or "normal"
    qos = facts.qos.get(qos_name)
    source = (f"partition QoS={qos_name}" if part.qos else "QOS normal, Slurm's default") + \
        " (sacctmgr show qos)"
    if qos is None:
        return Leaf(None, f"{source}: no such QOS"), Leaf(None, f"{source}: no such QOS")
    jobs = qos.max_jobs_per_user
    gpus = qos.max_gpus_per_user
    return (Leaf(jobs, f"{source} MaxJobsPU={jobs if jobs is not None else 'not set'}"),
            Leaf(gpus, f"{source} MaxTRESPU gres/gpu={gpus if gpus is not None else 'not set'}"))


def _partition(facts: ClusterFacts, part: PartitionInfo) -> tuple[Map | None, str | None]:
    """One partition's mapping, or (None, why it is left out)."""
    if part.state in ("INACTIVE", "DRAIN"):
        return None, f"partition {part.name}: State={part.state}, Slurm takes no new jobs: left out"
    if part.total_nodes == 0:
        return None, f"partition {part.name}: no nodes (Nodes={part.nodes}): left out"
    nodes = facts.nodes_of(part.name)
    src = f"{SCONTROL_PART} {part.name}"
    if nodes:
        gpus = min(n.gpus for n in nodes)
        cpus = min(n.cpus for n in nodes)
        mem_mb = min(n.memory_mb for n in nodes)
        gpus_c = f"GPUs per node: {_hetero({n.name: n.gpus for n in nodes}, '')} ({SCONTROL_NODE} Gres=)"
        cpus_c = f"CPUs per node: {_hetero({n.name: n.cpus for n in nodes}, '')} ({SCONTROL_NODE} CPUEfctv)"
        mem_c = f"{_hetero({n.name: n.memory_mb for n in nodes}, ' MB')} ({SCONTROL_NODE} RealMemory)"
        gpu_type, type_c = _gpu_type(nodes)
        nodes_c = f"TotalNodes={part.total_nodes} ({src}); {_unusable(nodes)}"
    else:
        # scontrol show node failed: the partition's totals averaged over its nodes.
        why = facts.gaps.get("nodes", "no node lists this partition")
        gpus = part.total_gpus // part.total_nodes
        cpus = part.total_cpus // part.total_nodes
        mem_mb = 0
        gpus_c = f"TRES gres/gpu / TotalNodes ({src}); GAP: per-node detail unknown: {why}"
        cpus_c = f"TotalCPUs / TotalNodes ({src}); GAP: per-node detail unknown"
        mem_c = "GAP: per-node memory unknown"
        gpu_type, type_c = None, "GAP: GPU type unknown without node records"
        nodes_c = f"TotalNodes={part.total_nodes} ({src}); node states unknown"
    if cpus < 1:
        return None, f"partition {part.name}: its nodes report no CPUs: left out"
    if part.max_nodes is None:
        max_nodes, max_nodes_c = None, f"MaxNodes=UNLIMITED ({src}): the partition's node count"
    elif part.max_nodes >= part.total_nodes:
        max_nodes, max_nodes_c = None, f"MaxNodes={part.max_nodes} ({src}), not below the node count"
    else:
        max_nodes, max_nodes_c = part.max_nodes, f"MaxNodes={part.max_nodes} ({src})"
    max_time = "infinite" if part.max_time.upper() in ("UNLIMITED", "INFINITE") else _time(part.max_time)
    jobs, gpus_pu = _qos_limits(facts, part)
    desc = []
    if part.hidden:
        desc.append("hidden partition (Hidden=YES: sinfo/squeue do not list it without -a)")
    if part.state != "UP":
        desc.append(f"State={part.state}: Slurm queues jobs here but starts none until it is UP")
    if nodes and len({(n.gpus, n.cpus) for n in nodes}) > 1:
        desc.append("heterogeneous nodes: limits are those of the smallest node")
    items: list[tuple[str, Value]] = [
        ("name", Leaf(part.name, f"PartitionName ({src})")),
        ("nodes", Leaf(part.total_nodes, nodes_c)),
        ("gpus_per_node", Leaf(gpus, gpus_c)),
        ("gpu_type", Leaf(gpu_type, type_c)),
        ("cpus_per_node", Leaf(cpus, cpus_c)),
        ("mem_per_node_gb", Leaf(mem_mb // 1024 if mem_mb >= 1024 else None,
                                 mem_c if mem_mb >= 1024 else f"{mem_c}: under 1 GB, left out")),
        ("max_nodes_per_job", Leaf(max_nodes, max_nodes_c)),
        ("max_time", Leaf(max_time, f"MaxTime={part.max_time} ({src})")),
        ("default", Leaf(part.default, f"Default={'YES' if part.default else 'NO'} ({src})")),
        ("max_jobs_per_user", jobs),
        ("max_gpus_per_user", gpus_pu),
    ]
    if desc:
        items.append(("description", Leaf("; ".join(desc), f"State={part.state} Hidden={'YES' if part.hidden else 'NO'}")))
    candidate = Map(tuple(items))
    try:
        Partition.model_validate(_data(candidate))
    except pydantic.ValidationError as exc:  # e.g. a name the schema refuses
        return None, (f"partition {part.name}: not a valid profile partition "
                      f"({describe_validation_error(exc, Partition)}): left out")
    return candidate, None


def _default_time(facts: ClusterFacts) -> Leaf:
    default = next((p for p in facts.partitions if p.default), None)
    if default is not None and default.default_time:
        return Leaf(_time(default.default_time),
                    f"DefaultTime of the default partition {default.name} ({SCONTROL_PART})")
    timed = [(parse_time(p.default_time), p.name) for p in facts.partitions if p.default_time]
    finite = [(s, n) for s, n in timed if s is not None]
    if finite:
        seconds, name = min(finite)
        why = "no default partition" if default is None else f"default partition {default.name} sets none"
        return Leaf(format_time(seconds), f"{why}: the shortest DefaultTime ({name}); "
                                          "hpcdl caps it at each partition's MaxTime")
    return Leaf("01:00:00", "no partition sets DefaultTime: hpcdl's default, capped at MaxTime")


def _mpi(facts: ClusterFacts) -> Map:
    mpi_default = facts.config.get("MpiDefault", "unknown")
    if facts.mpi is None:
        why = facts.gaps.get("mpi", "not asked")
        return Map((("launcher", Leaf("srun", "Slurm's launcher")),
                    ("srun_mpi", Leaf(None, f"GAP: srun --mpi=list failed ({why}): "
                                           f"MpiDefault={mpi_default} decides"))))
    offered = ", ".join(facts.mpi.types) or "nothing"
    versions = ", ".join(facts.mpi.pmix_versions) or "none listed"
    for choice in ("pmix", "pmi2"):
        if choice in facts.mpi.types:
            break
    else:
        choice = None  # type: ignore[assignment]
    return Map((
        ("launcher", Leaf("srun", "Slurm's launcher")),
        ("srun_mpi", Leaf(choice, f"srun --mpi=list offers {offered}; PMIx versions: {versions}; "
                                  f"MpiDefault={mpi_default} ({SCONTROL_CONFIG})")),
    ))


def _container(facts: ClusterFacts, any_gpus: bool, login: Login | None) -> Map:
    rt = facts.runtime
    where = f"on the login node {_target(login)}" if login else "on this node"
    if rt.name is None:
        runtime = Leaf("apptainer", f"GAP: {facts.gaps.get('runtime', 'no runtime found')} "
                                    f"{where}: the schema default")
    else:
        version = rt.version or f"version unknown ({facts.gaps.get('runtime', '?')})"
        runtime = Leaf(rt.name, f"{rt.path} --version: {version} ({where})")
    return Map((
        ("runtime", runtime),
        ("binds", Seq((), "not detectable: the site's shared filesystems")),
        ("nv", Leaf(any_gpus, "some partition has GPUs" if any_gpus else "no partition has GPUs")),
    ), MODE_NOTE if login else "")


# container.mode "auto" means "as on the host hpcdl runs on": from a laptop, not the nodes.
MODE_NOTE = ("container.mode not detected: auto would follow the machine hpcdl runs on, "
             "not the compute nodes; set it to setuid or unprivileged as they run the runtime")


def _target(login: Login) -> str:
    return f"{login.user}@{login.host}" if login.user else login.host


def _login(login: Login) -> Map:
    """The ``login:`` block: only what was given (ssh takes the rest from ~/.ssh/config)."""
    given = (("host", login.host, "--login"), ("user", login.user, "--login USER@HOST"),
             ("port", login.port, "--port"), ("identity", login.identity, "--identity"),
             ("jump", login.jump, "--jump"))
    return Map(tuple((key, Leaf(value, why)) for key, value, why in given if value is not None),
               "detected over SSH through this login node: hpcdl runs Slurm's commands there")


def _release(facts: ClusterFacts, notes: list[str],
             commands: str | None) -> tuple[tuple[str, Leaf], ...]:
    """The scheduler block's release lines: the directory the commands ran from
    (--commands), the release SLURM_VERSION names (hpcdl's scripts follow it) and
    whether the cluster enables --requeue=expedite; what hpcdl does differently there
    goes into ``notes``."""
    out: list[tuple[str, Leaf]] = []
    if commands:
        out.append(("commands", Leaf(commands, "--commands: Slurm's commands ran from there")))
    if facts.slurm_version is None:
        return tuple(out)
    try:
        found = releases.release_of(facts.slurm_version, tried=SCONTROL_CONFIG)
    except ValidationError as exc:
        notes.append(f"release: {exc.message}")
        return tuple(out)
    if found.note:
        notes.append(found.note)
    b = found.behaviour
    out.append(("release", Leaf(b.release, f"SLURM_VERSION={found.version} ({SCONTROL_CONFIG})"
                                + (" (nearest known)" if found.note else ""))))
    params = facts.config.get("SlurmctldParameters", "(null)")
    if b.requeue_expedite and releases.expedite_enabled(params):
        out.append(("requeue_expedite", Leaf(True, f"SlurmctldParameters has "
                                                   f"enable_expedited_requeue ({SCONTROL_CONFIG})")))
    notes.extend(f"Slurm {b.release}: {line}" for line in releases.differences(b))
    return tuple(out)


def describe(facts: ClusterFacts, name: str | None = None, when: str | None = None,
             login: Login | None = None, commands: str | None = None) -> Detected:
    """The profile for ``facts``: validated model, commented YAML, caveats. Pure.
    ``login``: the login node the facts were read through, written as the profile's.
    ``commands``: the directory Slurm's commands ran from (scheduler.commands).

    Raises ConfigError when no partition can be described (the schema needs one).
    """
    notes: list[str] = [f"GAP: {key}: {why}" for key, why in sorted(facts.gaps.items())]
    parts: list[Map] = []
    for info in facts.partitions:
        mapping, why = _partition(facts, info)
        if mapping is None:
            notes.append(why or f"partition {info.name}: left out")
        else:
            parts.append(mapping)
    if not parts:
        listed = ", ".join(p.name for p in facts.partitions) or "none"
        raise ConfigError(f"detect: no partition can be described (Slurm lists: {listed}; "
                          f"{'; '.join(notes) or 'no notes'})")
    if not any(p.default for p in facts.partitions):
        notes.append("no default partition (Default=YES on none): hpcdl picks the smallest that fits")
    if login is not None:
        notes.append(MODE_NOTE)
    pname = profile_name(facts, name)
    cluster = facts.cluster_name or "unknown"
    version = facts.slurm_version or "unknown version"
    any_gpus = any(_data(p)["gpus_per_node"] > 0 for p in parts)
    where = f" through {_target(login)}" if login else ""
    doc = Map((
        ("name", Leaf(pname, "--name" if name else f"ClusterName={cluster} ({SCONTROL_CONFIG})")),
        ("description", Leaf(f"Slurm cluster {cluster} (detected from Slurm {version}{where})",
                             "written by hpcdl profiles detect")),
        *((("login", _login(login)),) if login else ()),
        ("scheduler", Map((
            ("type", Leaf("slurm", "the commands answered: Slurm")),
            *_release(facts, notes, commands),
            ("gpu_request", Leaf("gres", f"GresTypes={facts.config.get('GresTypes', 'unknown')} "
                                         f"({SCONTROL_CONFIG}): --gres=gpu:N")),
            ("default_time", _default_time(facts)),
        ))),
        ("partitions", Seq(tuple(parts), f"{len(parts)} of {len(facts.partitions)} partitions "
                                         f"({SCONTROL_PART} -a)")),
        ("container", _container(facts, any_gpus, login)),
        ("mpi", _mpi(facts)),
    ))
    header = [
        f"Profile of Slurm cluster {cluster} ({version}), written by `hpcdl profiles detect`"
        + (f" at {when}" if when else ""),
        "Each value says where it came from. Check it with `hpcdl profiles diff FILE`.",
        f"Not detected: {NOT_DETECTED}.",
        *notes,
    ]
    text = to_yaml(doc, header)
    try:
        profile = Profile.model_validate(_data(doc))
    except pydantic.ValidationError as exc:
        raise ConfigError(f"detect: {describe_validation_error(exc, Profile)}") from exc
    # The text is what users keep: it must read back as the very same profile.
    reread = parse_yaml_model(text, Profile, source="<detected profile>", kind="profile")
    if reread != profile:
        raise ToolError("detect: the written profile does not read back as detected (a bug)")
    return Detected(profile, text, tuple(notes))
