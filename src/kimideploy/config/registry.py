"""The OCI registry drafters and datasets travel through, between the clusters that make them and
the ones that serve or train with them (`drafter publish`, `data publish`)."""

from typing import Annotated

from pydantic import Field

from kimideploy.config.base import DnsSubdomain, StrictModel

OCI_REPOSITORY = r"^[a-z0-9.-]+(:[0-9]+)?(/[a-z0-9._-]+)+$"
OCI_DIGEST = r"^sha256:[0-9a-f]{64}$"


class OciArtifact(StrictModel):
    """A drafter or dataset published as one OCI artifact (`kimideploy drafter publish`, `data
    publish`), pinned by digest; every file's sha256 is checked again after the pull."""

    repository: str = Field(
        pattern=OCI_REPOSITORY, description="e.g. ghcr.io/org/kimideploy/drafters/v4"
    )
    digest: str = Field(pattern=OCI_DIGEST, description="The artifact's manifest digest.")
    files: dict[str, Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]] = Field(
        default_factory=dict, description="File name -> sha256, as published."
    )

    @property
    def reference(self) -> str:
        return f"{self.repository}@{self.digest}"


class RegistryClient(StrictModel):
    """The ORAS CLI every image carries (built from its Go module in a builder stage)."""

    oras: str = Field(default="v1.3.6", pattern=r"^v\d+\.\d+\.\d+$")
    """The ORAS CLI version baked into images that push or pull artifacts."""
    builder: str = Field(
        pattern=r"^[^@\s]+@sha256:[0-9a-f]{64}$",
        description="Go toolchain image, pinned by digest like every image's base, that the "
        "images build the ORAS CLI in (a builder stage: nothing of it reaches the image but the "
        "one static binary).",
    )


class Registry(StrictModel):
    """Where published artifacts go and the Secrets that reach it (never credentials here)."""

    repository: str = Field(
        pattern=OCI_REPOSITORY,
        description="Prefix: drafter NAME goes to <repository>/drafters/NAME, a dataset to "
        "<repository>/datasets/NAME.",
    )
    push_secret: DnsSubdomain = Field(
        description="A kubernetes.io/dockerconfigjson Secret with push rights, in the namespace "
        "of every cluster that publishes."
    )
    pull_secret: DnsSubdomain = Field(
        description="A kubernetes.io/dockerconfigjson Secret with pull rights, in the namespace "
        "of every cluster that serves or trains from the registry."
    )
    ca_secret: DnsSubdomain | None = Field(
        default=None,
        description="A Secret holding `ca.crt` when the registry's certificate is signed by a "
        "private CA.",
    )
    plain_http: bool = Field(
        default=False, description="Speak HTTP, not HTTPS (a registry on a private network)."
    )
    client: RegistryClient = Field(
        description="The ORAS CLI the images carry; images rendered without a registry have none."
    )

    def drafter_repository(self, name: str) -> str:
        return f"{self.repository}/drafters/{name}"

    def dataset_repository(self, name: str) -> str:
        return f"{self.repository}/datasets/{name}"
