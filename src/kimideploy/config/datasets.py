"""Published conversation datasets: generated once (hours of the target's time), pushed to the
registry by `kimideploy data publish`, and named by a cluster's pipeline instead of generating
again (`clusters.<c>.workloads.train.conversations`). Hidden states are never published: they
are regenerated from the conversations by `run extract`, or computed online, and are 30-100x
larger (docs/reference/domain.md §5)."""

from typing import Annotated, Any, Literal, Self

from pydantic import Field, model_validator

from kimideploy.config.base import Name, StrictModel
from kimideploy.config.fingerprints import fingerprint_id
from kimideploy.config.registry import OciArtifact


class PublishedDataset(StrictModel):
    kind: Literal["conversations"] = "conversations"
    """What the dataset holds; conversations are the only kind published."""
    oci: OciArtifact = Field(description="Set by `kimideploy data publish` (pinned by digest).")
    fingerprint: str = Field(
        pattern=r"^[0-9a-f]{12}$",
        description="The id in the dataset's fingerprint.json (what made it): the pull and "
        "every stage that reads it check it before any GPU time.",
    )
    made_from: dict[str, Any] = Field(
        description="The fields of its fingerprint (target, prompt set, sampling, shards): "
        "what the stages that read it compare with, as for conversations made here."
    )
    samples: Annotated[int, Field(ge=1)] = Field(description="Conversations it holds.")
    made_on: Name = Field(description="The cluster that generated it.")
    made_for: Name | None = Field(
        default=None, description="The drafter whose pipeline generated it."
    )

    @model_validator(mode="after")
    def _fingerprint_is_of_its_fields(self) -> Self:
        if fingerprint_id(self.made_from) != self.fingerprint:
            raise ValueError(
                f"fingerprint {self.fingerprint} is not the id of made_from "
                f"({fingerprint_id(self.made_from)}): the entry was edited by hand; publish the "
                "dataset again to rewrite it"
            )
        return self
