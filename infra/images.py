"""The workload images: which ones a stack builds, from what, and under which tag.

`pulumi up` builds each image the stack's pods run from this checkout (workloads/Dockerfile,
the context .dockerignore lets through: IMAGE_CONTEXT) and pushes it to the stack's registry
before any pod needs it (infra/components/images.py). The tag is a digest of that context, so
a change under workloads/ (or to the Dockerfile, the requirements, pyproject.toml) is a new
tag that rolls the workloads forward, and an unchanged tree is the same tag: nothing to build.
A stack that pins an image (park:training.image, park:serving.image, park:rl.image) builds
nothing for it.

Pure apart from reading the context's files, once per process; resolve calls it.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path

import workloads
from infra import engines
from infra.versions import IMAGE_TAG

# What the image build sends to BuildKit, relative to the repository root; .dockerignore
# lets exactly these through (a test holds the two equal).
IMAGE_CONTEXT = ("pyproject.toml", "workloads")
DOCKERFILE = "workloads/Dockerfile"
SKIPPED = ("__pycache__",)  # never part of the context (.dockerignore)
SKIPPED_SUFFIXES = (".pyc",)
TAG_PREFIX = "src-"
TAG_HEX = 16  # 64 bits of the digest: a tag, not a security boundary
# Bounds on reading the context (a checkout holds ~150 small files).
MAX_CONTEXT_FILES = 5000
MAX_CONTEXT_BYTES = 256 * 1024 * 1024
# The Dockerfile stage of the training image (and of the default engine, which shares it).
WORKLOAD_TARGET = "workloads"


class ContextError(ValueError):
    """The build context is not what an image can be built from."""


@dataclass(frozen=True)
class ImageBuild:
    """One image the stack builds and pushes before its pods run it."""

    name: str  # the image's name in the registry: park-workloads, park-serve-vllm-tpu
    target: str  # its workloads/Dockerfile stage
    repository: str  # <region>-docker.pkg.dev/<project>/<repository>/<name>
    tag: str  # src-<digest of the context>
    used_by: tuple[str, ...]  # the stack keys whose pods run it

    @property
    def ref(self) -> str:
        """What the pods pull (the component hands them the pushed digest of this tag)."""
        return f"{self.repository}:{self.tag}"


def context_root() -> Path | None:
    """The repository root the images are built from: the checkout this code runs in. None
    for an installed wheel, which carries workloads/ but not pyproject.toml: no image can be
    built from it, so a stack run from one pins its images."""
    root = Path(workloads.__file__).resolve().parent.parent
    if (root / "pyproject.toml").is_file() and (root / DOCKERFILE).is_file():
        return root
    return None


def _context_files(root: Path) -> list[Path]:
    files: list[Path] = []
    for entry in IMAGE_CONTEXT:
        path = root / entry
        found = [path] if path.is_file() else sorted(path.rglob("*"))
        for item in found:
            relative = item.relative_to(root)
            if any(part in SKIPPED for part in relative.parts):
                continue
            if item.suffix in SKIPPED_SUFFIXES or item.is_symlink() or not item.is_file():
                continue
            files.append(item)
            if len(files) > MAX_CONTEXT_FILES:
                raise ContextError(f"{root}: more than {MAX_CONTEXT_FILES} files in the context")
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


@functools.lru_cache(maxsize=4)
def context_tag(root: Path) -> str:
    """``src-<digest>``: each context file's path and bytes, in path order."""
    digest = hashlib.sha256()
    total = 0
    for path in _context_files(root):
        data = path.read_bytes()
        total += len(data)
        if total > MAX_CONTEXT_BYTES:
            raise ContextError(f"{root}: the context is over {MAX_CONTEXT_BYTES >> 20} MiB")
        name = path.relative_to(root).as_posix().encode()
        digest.update(len(name).to_bytes(4, "big") + name)
        digest.update(len(data).to_bytes(8, "big") + data)
    return TAG_PREFIX + digest.hexdigest()[:TAG_HEX]


def target_of(image_name: str) -> str:
    """The Dockerfile stage that builds an image of the engines' table."""
    for engine in engines.ENGINES.values():
        if engine.image == image_name:
            return engine.image_target
    return WORKLOAD_TARGET


def default_ref(registry_url: str, name: str) -> str:
    """What pods run when the stack pins no image: the build of this checkout, by its tag;
    from an installed wheel (no context), the release's tag, pushed by hand (README)."""
    root = context_root()
    return f"{registry_url}/{name}:{context_tag(root) if root else IMAGE_TAG}"


def builds(registry_url: str, wanted: dict[str, list[str]]) -> tuple[ImageBuild, ...]:
    """The images to build: `wanted` maps an image name to the stack keys whose pods run it
    (those that pin no image of their own). None without a context to build from."""
    root = context_root()
    if root is None:
        return ()
    tag = context_tag(root)
    return tuple(
        ImageBuild(
            name=name,
            target=target_of(name),
            repository=f"{registry_url}/{name}",
            tag=tag,
            used_by=tuple(keys),
        )
        for name, keys in wanted.items()
    )
