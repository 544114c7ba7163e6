"""Shared pydantic configuration: camelCase field names on the wire, unknown fields rejected."""

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class SpecModel(BaseModel):
    """Base of every spec section.

    Unknown fields are errors (a typo must never be ignored silently); YAML uses camelCase like Kubernetes.
    """

    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        frozen=True,
        allow_inf_nan=False,  # a limit of .inf or .nan is a typo, and would reach JSON output as Infinity
    )
