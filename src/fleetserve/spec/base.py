"""Shared pydantic configuration: camelCase field names on the wire, unknown fields rejected."""

import types
import typing

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator
from pydantic.alias_generators import to_camel

_NUMBERS = (int, float)


class TakesQuantity:
    """Marks a number field that also reads a Kubernetes quantity string (`maxBytes: 4Gi`): its strings are the
    field's own validator's to read, not a quoted number to refuse."""


def _boolean(annotation) -> bool:
    """A field typed bool (optionally None)."""
    if annotation is bool:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args == [bool]
    if typing.get_origin(annotation) is typing.Annotated:
        return _boolean(typing.get_args(annotation)[0])
    return False


def _numeric(annotation) -> bool:
    """A field typed int or float (optionally None): YAML's `true` is not a number there."""
    if annotation in _NUMBERS:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return bool(args) and all(a in _NUMBERS for a in args)
    if typing.get_origin(annotation) is typing.Annotated:
        return _numeric(typing.get_args(annotation)[0])
    return False


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

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value, info: ValidationInfo):
        """pydantic reads `true` as 1 in a number field (`replicas: true`, `ttftP95Ms: true`), and `"3"` as 3: the
        first a typo, the second what Kubernetes refuses; both are refused."""
        if not info.field_name:
            return value
        field = cls.model_fields[info.field_name]
        annotation = field.annotation
        if isinstance(value, bool) and _numeric(annotation):
            raise ValueError("expected a number, got a boolean")
        # `replicas: "3"`: the CRD's schema refuses it, so `render k8s` and the operator would disagree with `up`
        # and `validate`, which pydantic let through
        if isinstance(value, str) and _numeric(annotation) and \
                not any(isinstance(m, TakesQuantity) for m in field.metadata):
            raise ValueError(f"expected a number, got the string {value[:40]!r} (write it without quotes)")
        # `enabled: "true"`, `"off"` or `1`: pydantic read them as booleans, and the CRD (type: boolean) refuses them,
        # so `kubectl apply` of what `validate` passed failed
        if _boolean(annotation) and value is not None and not isinstance(value, bool):
            quoted = isinstance(value, str) and value.lower() in ("true", "false")
            raise ValueError(f"expected true or false, got {value!r}"[:80] + (" (write it without quotes)"
                                                                             if quoted else ""))
        if isinstance(value, dict) and typing.get_origin(annotation) is dict:  # {"g6e.xlarge": true}
            _key, item = typing.get_args(annotation) or (None, None)
            if _numeric(item) and any(isinstance(v, bool) for v in value.values()):
                raise ValueError("expected numbers as values, got a boolean")
            if _numeric(item) and any(isinstance(v, str) for v in value.values()):
                raise ValueError("expected numbers as values, got a string (write them without quotes)")
        return value
