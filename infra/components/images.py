"""A workload image built from this checkout and pushed to Artifact Registry during `pulumi up`.

Built with pulumi-docker-build (BuildKit): the deployer's machine or CI runner needs a Docker
engine or a BuildKit builder (GitHub's ubuntu runners have both), nothing else; the push uses
the deployer's own short-lived Google token (the gcp provider's), never a key. The image is
tagged by its context's digest (infra.images): an unchanged tree plans no build, a change under
workloads/ is a new tag and so a new digest in every pod that runs it. Previews do not build
(a preview is fast and needs no Docker); the Dockerfile's syntax is still checked then.
"""

import os
from pathlib import Path
from typing import NotRequired, TypedDict

import pulumi

from infra.components._base import Component, bad_value
from infra.images import DOCKERFILE, ImageBuild, context_root, context_tag

# TPU hosts are x86-64.
PLATFORM = "linux/amd64"
# Layer cache kept beside the image in the same repository (BuildKit's registry cache, OCI
# manifest form, which Artifact Registry accepts): CI runners start cold.
CACHE_TAG = "buildcache"


def _is_registry_image(repository: str) -> bool:
    host = repository.split("/", 1)[0]
    return host.endswith("-docker.pkg.dev") and repository.count("/") == 3


def _checkout() -> str | None:
    """The checkout this runs from, relative to the working directory when inside it (`pulumi
    up` runs the stack program from the repository root: "."), so that the state and renders
    do not carry one machine's path."""
    root = context_root()
    if root is None:
        return None
    here = Path.cwd().resolve()
    return os.path.relpath(root, here) if root.is_relative_to(here) else str(root)


class WorkloadImageArgs(TypedDict):
    """An image of workloads/Dockerfile, pushed to an Artifact Registry repository."""

    repository: pulumi.Input[str]
    """Where it is pushed: `<region>-docker.pkg.dev/<project>/<repository>/<image>`."""
    tag: NotRequired[str]
    """Its tag. Default: `src-<digest of the context>`, so a changed checkout is a new tag."""
    target: NotRequired[str]
    """The Dockerfile stage: `workloads` (training and vllm-torchtpu), `train` or
    `serve-vllm-tpu`. Default: workloads."""
    context: NotRequired[str]
    """The build context, a park-gke checkout's root. Default: the checkout this runs from."""


class WorkloadImage(Component):
    """One workload image: built with BuildKit, pushed, and referenced by digest."""

    ref: pulumi.Output[str]
    """`<repository>:<tag>@sha256:...`: what pods run (the digest, so a re-pushed tag cannot
    change them)."""

    def __init__(
        self, name: str, args: WorkloadImageArgs, opts: pulumi.ResourceOptions | None = None
    ):
        super().__init__(name, opts)
        args = self.checked(args, WorkloadImageArgs)
        repository = args["repository"]
        if isinstance(repository, str) and not _is_registry_image(repository):
            self.refuse(
                [
                    bad_value(
                        "repository",
                        repository,
                        "an Artifact Registry image path, <region>-docker.pkg.dev/<project>/"
                        "<repository>/<image>",
                    )
                ]
            )
        self._build(repository, args.get("tag"), args.get("target"), args.get("context"))

    @classmethod
    def of_plan(
        cls, name: str, build: ImageBuild, opts: pulumi.ResourceOptions | None = None
    ) -> "WorkloadImage":
        """The stack program's: an image its plan builds (infra.images.ImageBuild)."""
        self = cls.planned(name, opts)
        self._build(build.repository, build.tag, build.target, None)
        return self

    def _build(
        self,
        repository: pulumi.Input[str],
        tag: str | None,
        target: str | None,
        context: str | None,
    ) -> None:
        name = self._component_name
        context = context or _checkout()
        if context is None:
            self.refuse(
                [
                    "args.context: this park-gke is an installed package, not a checkout: "
                    "build the images from a checkout, or pin them (image arguments) instead"
                ]
            )
        tag = tag or context_tag(Path(context).resolve())
        image = pulumi.Output.from_input(repository)
        import pulumi_docker_build as docker_build
        from pulumi_gcp.organizations import get_client_config_output

        # The deployer's own OAuth token (what `gcloud auth print-access-token` gives), as
        # Artifact Registry's docs have Docker log in with: user oauth2accesstoken.
        token = get_client_config_output(opts=pulumi.InvokeOutputOptions(parent=self))
        image = docker_build.Image(
            f"{name}-build",
            context={"location": context},
            dockerfile={"location": f"{context}/{DOCKERFILE}"},
            target=target or "workloads",
            platforms=[PLATFORM],
            tags=[image.apply(lambda r: f"{r}:{tag}")],
            push=True,
            build_on_preview=False,
            registries=[
                {
                    "address": image.apply(lambda r: r.split("/", 1)[0]),
                    "username": "oauth2accesstoken",
                    "password": pulumi.Output.secret(token.access_token),
                }
            ],
            cache_from=[{"registry": {"ref": image.apply(lambda r: f"{r}:{CACHE_TAG}")}}],
            cache_to=[
                {
                    "registry": {
                        "ref": image.apply(lambda r: f"{r}:{CACHE_TAG}"),
                        "mode": "max",
                        "image_manifest": True,
                        "oci_media_types": True,
                    }
                }
            ],
            opts=self.child_options(),
        )
        self.ref = image.ref
        self.register()
