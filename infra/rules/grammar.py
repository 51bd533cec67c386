"""What each kind of name and reference may be, by the grammar of whoever reads it.

One function per kind; each answers None for a good value, else what is wrong and what is
allowed, so a rule can say it under its own key. The grammars are the readers' own (tests hold
them to those readers where a library has one):

- a Hugging Face repository id: huggingface_hub's `validate_repo_id` (1-96 characters of
  ASCII letters, digits, '-', '_', '.', an optional `namespace/`, no `--` or `..`, no leading
  or trailing '-' or '.', not ending in `.git`);
- a data set split: `datasets`' split name (`\\w+(\\.\\w+)*`, here ASCII);
- a Cloud Storage bucket and object (cloud.google.com/storage/docs/buckets#naming and
  .../objects#naming), and park's own rule for paths in them: no `.`/`..` segments, no empty
  one (a path may not climb out of the prefix it names);
- Kubernetes names (k8s.io/apimachinery/pkg/util/validation): a DNS-1123 label or subdomain,
  a DNS-1035 label, a label value, a qualified name (label key);
- Compute Engine names (RFC 1035 labels: networks, ranges, reservations) and machine types.
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
from typing import Any


def _mismatch(value: str, pattern: re.Pattern[str], rule: str, longest: int = 0) -> str | None:
    """`rule` for a value longer than `longest` characters (when given) or not matching
    `pattern`: the check of every name whose grammar is a regex and a length."""
    if (longest and len(value) > longest) or not pattern.match(value):
        return rule
    return None


# ---- Hugging Face -----------------------------------------------------------------------------

_HF_PART = r"[A-Za-z0-9_.\-]{1,96}"
_HF_REPO = re.compile(rf"^(?:{_HF_PART}/)?{_HF_PART}$")
HF_REPO_RULE = (
    "a Hugging Face repository id: [namespace/]name, each 1-96 ASCII letters, digits, '-', "
    "'_' or '.', not starting or ending with '-' or '.', without '--' or '..', not ending "
    "in .git"
)


def hf_repo_problem(value: str) -> str | None:
    """huggingface_hub's validate_repo_id, as a rule (its regex's word boundaries spelled out:
    each part starts and ends with a letter, digit or '_')."""
    if not _HF_REPO.match(value) or "--" in value or ".." in value or value.endswith(".git"):
        return f"not {HF_REPO_RULE}"
    if any(part[0] in "-." or part[-1] in "-." for part in value.split("/")):
        return f"not {HF_REPO_RULE}"
    return None


HF_DATA_PREFIX = "hf:"  # workloads/train/config_rules.py's
_HF_CONFIG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$")


def hf_dataset_problem(value: str) -> str | None:
    """`hf:NAME[:CONFIG]`: NAME a hub data set id, CONFIG one of its configurations' names."""
    name, _, config = value.removeprefix(HF_DATA_PREFIX).partition(":")
    wrong = hf_repo_problem(name)
    if wrong:
        return f"hf:NAME[:CONFIG] with NAME {wrong.removeprefix('not ')}"
    if config and not _HF_CONFIG.match(config):
        return "hf:NAME[:CONFIG] with CONFIG of ASCII letters, digits, '_', '.', '-'"
    return None


_SPLIT = re.compile(r"^[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)*$")


def split_problem(value: str) -> str | None:
    """A split of a streamed hub data set (datasets' split names; no slicing when streaming)."""
    rule = "a split name: ASCII letters, digits and '_', dot-separated (e.g. train)"
    return _mismatch(value, _SPLIT, rule, 128)


# ---- Cloud Storage ---------------------------------------------------------------------------

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9_.\-]{1,220}[a-z0-9]$")
BUCKET_RULE = (
    "a bucket name: 3-63 lowercase letters, digits, '-', '_' and '.' (up to 222 with dots, "
    "63 between them), starting and ending with a letter or digit, not an IP address, not "
    "starting with goog nor holding google"
)


def bucket_problem(name: str) -> str | None:
    parts = name.split(".")
    if (
        not _BUCKET.match(name)
        or any(not part or len(part) > 63 for part in parts)
        or ("." not in name and len(name) > 63)
        or name.startswith("goog")
        or re.search(r"g[o0][o0]gle", name)
        or _is_ip(name)
    ):
        return f"not {BUCKET_RULE}"
    return None


def _is_ip(name: str) -> bool:
    try:
        ipaddress.IPv4Address(name)
    except ValueError:
        return False
    return True


def path_problem(path: str) -> str | None:
    """A path inside a bucket or a folder: segments, none `.` or `..` or empty, no CR/LF, at
    most 1024 bytes (Cloud Storage's object name limit)."""
    if len(path.encode()) > 1024:
        return "longer than 1024 bytes"
    if "\r" in path or "\n" in path:
        return "holds a line break"
    segments = path.strip("/").split("/")
    if path.strip("/") and any(s in ("", ".", "..") for s in segments):
        return "has an empty, '.' or '..' segment: a path may not climb out of where it points"
    return None


def gcs_uri_problem(uri: str) -> str | None:
    """`gs://BUCKET[/PATH]`."""
    bucket, _, path = uri.removeprefix("gs://").partition("/")
    wrong = bucket_problem(bucket)
    if wrong:
        return f"not a bucket path gs://BUCKET[/PATH]: BUCKET is {wrong}"
    wrong = path_problem(path) if path else None
    return f"not a bucket path gs://BUCKET[/PATH]: PATH {wrong}" if wrong else None


def under(path: str, folder: str) -> bool:
    """Whether `path` is `folder` or inside it (both absolute, normalised)."""
    folder = folder.rstrip("/") or "/"
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def mount_path_problem(path: str) -> str | None:
    """An absolute, normalised folder path of plain characters."""
    if not re.match(r"^(/[A-Za-z0-9_.\-]+)+$", path) or posixpath.normpath(path) != path:
        return (
            "an absolute folder path of letters, digits, '_', '.' and '-' segments, without "
            "'.', '..', '//' or a trailing '/'"
        )
    return None


def mounted_path_problem(path: str, mount: str) -> str | None:
    """A local path the pods read: inside the bucket's mount, and never climbing out of it."""
    wrong = path_problem(path)
    if wrong:
        return wrong
    if not under(posixpath.normpath(path), mount) or path == mount:
        return f"a local path must be inside the bucket's mount {mount}/ (or use gs://)"
    return None


# ---- Kubernetes (k8s.io/apimachinery/pkg/util/validation/validation.go) ----------------------

_DNS1123_LABEL = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
DNS1123_LABEL = re.compile(rf"^{_DNS1123_LABEL}$")
DNS1123_SUBDOMAIN = re.compile(rf"^{_DNS1123_LABEL}(?:\.{_DNS1123_LABEL})*$")
DNS1035_LABEL = re.compile(r"^[a-z](?:[-a-z0-9]*[a-z0-9])?$")
_QUALIFIED_NAME = re.compile(r"^(?:[A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


def dns1123_label_problem(value: str) -> str | None:
    rule = (
        "a DNS-1123 label: at most 63 lowercase letters, digits and '-', starting and ending "
        "with a letter or digit"
    )
    return _mismatch(value, DNS1123_LABEL, rule, 63)


def dns1123_subdomain_problem(value: str) -> str | None:
    rule = (
        "a DNS-1123 subdomain: at most 253 lowercase letters, digits, '-' and '.', starting "
        "and ending with a letter or digit"
    )
    return _mismatch(value, DNS1123_SUBDOMAIN, rule, 253)


def dns1035_label_problem(value: str, limit: int = 63) -> str | None:
    rule = (
        f"a DNS-1035 label: at most {limit} lowercase letters, digits and '-', starting with a "
        "letter, ending with a letter or digit"
    )
    return _mismatch(value, DNS1035_LABEL, rule, limit)


def label_value_problem(value: str) -> str | None:
    """A label value; empty is one."""
    rule = (
        "a label value: at most 63 letters, digits, '-', '_' and '.', starting and ending with "
        "a letter or digit"
    )
    return _mismatch(value, _QUALIFIED_NAME, rule, 63) if value else None


def label_key_problem(key: str) -> str | None:
    prefix, _, name = key.rpartition("/")
    bad_prefix = bool(prefix) and dns1123_subdomain_problem(prefix) is not None
    if bad_prefix or len(name) > 63 or not _QUALIFIED_NAME.match(name):
        return (
            "a label key: an optional DNS-1123 subdomain and '/', then at most 63 letters, "
            "digits, '-', '_' and '.', starting and ending with a letter or digit"
        )
    return None


# ---- Compute Engine ---------------------------------------------------------------------------

RFC1035 = re.compile(r"^[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$")


def gce_name_problem(value: str) -> str | None:
    """A Compute Engine resource name (RFC 1035: networks, secondary ranges, reservations)."""
    rule = (
        "a Compute Engine name: 1-63 lowercase letters, digits and '-', starting with a letter, "
        "not ending with '-'"
    )
    return _mismatch(value, RFC1035, rule)


_RESERVATION = re.compile(
    r"^(?:projects/[a-z][-a-z0-9.:]{4,62}[a-z0-9]/reservations/)?"
    r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?"
    r"(?:/reservationBlocks/[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?"
    r"(?:/reservationSubBlocks/[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)?)?$"
)


def reservation_problem(value: str) -> str | None:
    """A reservation GKE can consume: its name, a shared one's `projects/P/reservations/NAME`,
    either with `/reservationBlocks/BLOCK`, that with `/reservationSubBlocks/SUB` (TPU7x's unit
    of an All Capacity reservation)."""
    rule = (
        "a reservation: NAME or projects/PROJECT/reservations/NAME (optionally "
        "/reservationBlocks/BLOCK[/reservationSubBlocks/SUB]), each name 1-63 lowercase "
        "letters, digits and '-'"
    )
    return _mismatch(value, _RESERVATION, rule)


_MACHINE_TYPE = re.compile(r"^[a-z][a-z0-9]{0,9}(?:-[a-z0-9]{1,20}){1,5}$")
_ACCELERATOR = re.compile(r"^[a-z][a-z0-9]*(?:-[a-z0-9]+){0,8}$")


def machine_type_problem(value: str) -> str | None:
    """A Compute Engine machine type: `<series>-<kind>[-<n>]...` (e2-standard-8,
    n2-custom-8-16384, a3-highgpu-8g)."""
    rule = "a machine type: lowercase letters and digits in '-'-separated words (e2-standard-8)"
    return _mismatch(value, _MACHINE_TYPE, rule, 63)


def accelerator_type_problem(value: str) -> str | None:
    rule = "an accelerator type: lowercase '-'-separated words (nvidia-h100-80gb)"
    return _mismatch(value, _ACCELERATOR, rule, 63)


# ---- Kubernetes objects ------------------------------------------------------------------------

# The name rule of each kind park creates (Kubernetes' own; KubeRay refuses a RayJob, RayService
# or RayCluster name that is not a DNS-1035 label of at most 47 characters, its
# MaxRay{Job,Service}NameLength: the cluster it makes takes a suffix).
KUBERAY_NAME_MAX = 47
_LABEL_NAMED = {"Namespace": dns1123_label_problem}
_DNS1035_NAMED = {"Service"}
_KUBERAY_KINDS = {"RayJob", "RayService", "RayCluster"}


def namespace_problem(value: str) -> str | None:
    wrong = dns1123_label_problem(value)
    if wrong is None and value.startswith("kube-"):
        wrong = "not kube-* (Kubernetes' own namespaces)"
    return f"a namespace: {wrong}" if wrong else None


def object_name_problem(kind: str, name: str) -> str | None:
    """What Kubernetes (or KubeRay) says of `name` for an object of `kind`."""
    if kind in _KUBERAY_KINDS:
        return dns1035_label_problem(name, KUBERAY_NAME_MAX)
    if kind in _DNS1035_NAMED:
        return dns1035_label_problem(name)
    check = _LABEL_NAMED.get(kind, dns1123_subdomain_problem)
    return check(name)


def labels_problems(labels: object, where: str) -> list[str]:
    """Label keys and values (also what a nodeSelector matches)."""
    if not isinstance(labels, dict):
        return []
    found = []
    for key, value in labels.items():
        wrong = label_key_problem(str(key)) or label_value_problem(str(value))
        if wrong:
            found.append(f"{where} {key!r}: {value!r} is not {wrong}")
    return found


def object_problems(manifest: dict[str, Any]) -> list[str]:
    """Every name of one Kubernetes object Kubernetes would refuse: its name, namespace and
    labels, and its pod templates' labels and nodeSelectors."""
    kind = str(manifest.get("kind"))
    meta = manifest.get("metadata") or {}
    name, namespace = str(meta.get("name")), meta.get("namespace")
    what = f"{kind} {namespace + '/' if namespace else ''}{name}"
    found = []
    wrong = object_name_problem(kind, name)
    if wrong:
        found.append(f"the {what} it would create: its name is not {wrong}")
    if namespace is not None and (wrong := namespace_problem(str(namespace))):
        found.append(f"the {what} it would create: its namespace is not {wrong}")
    found += labels_problems(meta.get("labels"), f"the {what} it would create: label")
    for template in _pod_templates(manifest.get("spec")):
        found += labels_problems(
            (template.get("metadata") or {}).get("labels"), f"the pods of {what}: label"
        )
        spec = template.get("spec") or {}
        found += labels_problems(spec.get("nodeSelector"), f"the pods of {what}: nodeSelector")
    return found


def _pod_templates(spec: object) -> list[dict[str, Any]]:
    """The pod templates of a Job, a RayJob (head, workers, submitter) or a RayService."""
    if not isinstance(spec, dict):
        return []
    found = []
    if isinstance(spec.get("template"), dict):
        found.append(spec["template"])
    if isinstance(spec.get("submitterPodTemplate"), dict):
        found.append(spec["submitterPodTemplate"])
    cluster = spec.get("rayClusterSpec") or spec.get("rayClusterConfig")
    if isinstance(cluster, dict):
        groups = [cluster.get("headGroupSpec") or {}, *(cluster.get("workerGroupSpecs") or [])]
        found += [g["template"] for g in groups if isinstance(g.get("template"), dict)]
    return found
