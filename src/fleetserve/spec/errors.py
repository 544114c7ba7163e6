"""Spec errors that name the field path, the bad value and the allowed values."""

from __future__ import annotations

import re
import reprlib
import types
import typing
from dataclasses import dataclass, field

from pydantic import BaseModel, ValidationError

from fleetserve.spec.strict_yaml import expanded_size


@dataclass(frozen=True)
class SpecProblem:
    path: str
    message: str
    # a warning about what the spec asks of any platform (a replica no listed type takes), kept where notes on the
    # same field about the local fleet only are dropped (render k8s, the webhook, the operator's status)
    everywhere: bool = field(default=False, compare=False)
    # fleetserve's path when `path` names the user's own format's field (HyperPod): what filters by path read
    ours: str = field(default="", compare=False)

    @property
    def fleetserve_path(self) -> str:
        return self.ours or self.path

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class SpecError(ValueError):
    """A spec that cannot be accepted; `problems` lists every offending field."""

    def __init__(self, problems: list[SpecProblem], source: str | None = None):
        self.problems = problems
        self.source = source
        head = f"invalid endpoint spec{f' {source}' if source else ''}"
        super().__init__(head + ":\n" + "\n".join(f"  - {p}" for p in problems))


def format_path(loc: tuple[str | int, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _unwrap(annotation: object) -> type[BaseModel] | None:
    """The pydantic model inside an annotation such as `X | None` or `list[X]`, if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, list, tuple, dict):
        for arg in typing.get_args(annotation):
            found = _unwrap(arg)
            if found is not None:
                return found
    return None


def _model_at(root: type[BaseModel], loc: tuple[str | int, ...]) -> type[BaseModel] | None:
    model: type[BaseModel] | None = root
    for part in loc:
        if model is None:
            return None
        if isinstance(part, int):
            continue
        field = next(
            (f for name, f in model.model_fields.items() if part in (name, f.alias)),
            None,
        )
        if field is None:
            return None
        model = _unwrap(field.annotation)
    return model


def _allowed_fields(model: type[BaseModel]) -> str:
    return ", ".join(sorted(f.alias or name for name, f in model.model_fields.items()))


_SHORT = reprlib.Repr()  # attributes, not keywords: Python 3.11's Repr takes none
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict, _SHORT.maxstring, _SHORT.maxother, _SHORT.maxlong = 3, 8, 8, 80, 80, 80


def short_value(value: object) -> str:
    """At most 80 characters of the value, as Python writes it; a large one (hundreds of values) is abridged as it
    is written, never printed whole first: an alias bomb's took `validate` minutes before the cut."""
    text = repr(value) if expanded_size(value, 256) <= 256 else _SHORT.repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


_INNER_PATH = re.compile(r"^([A-Za-z][A-Za-z0-9]*)((?:\[\d+\]|\.[A-Za-z][A-Za-z0-9]*)*): (.+)$", re.S)


def _named_inside(root: type[BaseModel], at: tuple, loc: tuple, msg: str) -> tuple[tuple, str]:
    """A section's check that names a field inside it ("schedules[0].end: ...") is reported at that field's path
    (spec.autoscaling.schedules[0].end), when the name's first part is a field of the section."""
    model = _model_at(root, at)
    if model is None:
        return loc, msg

    def field_of_section(text: str):
        found = _INNER_PATH.match(text)
        return found if found and any(found[1] in (name, f.alias) for name, f in model.model_fields.items()) else None

    section = f"{at[-1]}." if at and isinstance(at[-1], str) else ""
    found = field_of_section(msg)
    if found is None and section and msg.startswith(section):  # "engine.image: ..." from the engine section
        found = field_of_section(msg[len(section):])
    if found is None:
        return loc, msg
    first = found[1]
    inner: list[str | int] = [first]
    for part in re.findall(r"\[(\d+)\]|\.([A-Za-z][A-Za-z0-9]*)", found[2]):
        inner.append(int(part[0]) if part[0] else part[1])
    return loc + tuple(inner), found[3]


# what a pattern the schema checks a string against asks for, in words: the raw regular expression was the message
PATTERN_HINTS = {
    r"^\d+%?$": "a count or a percentage, like 1 or 10%",
    r"^/": "an absolute path, starting with /",
    r"^\d+[smhdwy]$": "a duration, like 12h or 1d",
    r"^[0-9a-f]{64}$": "a sha256 digest: 64 lower-case hexadecimal digits",
    # HyperPod's CRD
    r"^s3://([^/]+)/?(.*)$": "an s3:// URI, like s3://my-bucket/certs",
    r"^s3://([^/]+)(/[^,=]*)?$": "an s3:// URI without ',' or '=' in its path, like s3://my-bucket/prefix",
    r"^ml\..*": "a SageMaker instance type, like ml.g5.8xlarge",
    r"^[0-9a-f]{40}$": "a full commit SHA: 40 lower-case hexadecimal digits",
    r"^[a-zA-Z0-9_.-]+/[a-zA-Z0-9_.-]+$": "a Hugging Face model id, like meta-llama/Llama-3.1-8B-Instruct",
    r"^/.*": "an absolute path, starting with /",
    r"^http$|^grpc$": "http or grpc",
    r"arn:aws[a-z\-]*:acm:[a-z0-9\-]*:[0-9]{12}:certificate/.*": "an ACM certificate ARN, like "
    "arn:aws:acm:us-west-2:123456789012:certificate/...",
    r"^arn:aws:acm:[a-z0-9-]+:[0-9]{12}:certificate/[a-fA-F0-9-]+$": "an ACM certificate ARN, like "
    "arn:aws:acm:us-west-2:123456789012:certificate/1a2b3c4d-...",
    r"^$|^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$": "a name of letters, digits and '-', starting with a letter or digit, "
    "at most 63 characters",
    r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}": "a name starting with a letter or digit, then letters, digits and '-'",
    r"^/[a-zA-Z0-9\-_.\/]*$": "an absolute URL path of letters, digits and -_./, like /metrics",
    r"^Z[A-Z0-9]+$": "a Route 53 hosted zone id, like Z0123456789ABCDEFGHIJ",
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$": "a Kubernetes name: lower-case letters, "
    "digits, '-' and '.', starting and ending with a letter or digit",
    r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$": "a lower-case domain name, like "
    "chat.example.com",
    r"^[a-zA-Z0-9:/_-]*$": "a KMS key id or ARN (letters, digits and :/_-)",
    r"^https:\/\/aps-workspaces\.[a-zA-Z0-9-]+(?:\.[a-zA-Z0-9-]+)*\.amazonaws\.com\/workspaces\/ws-[a-zA-Z0-9-]+$"
    r"|^$": "an Amazon Managed Prometheus workspace URL, like "
    "https://aps-workspaces.us-west-2.amazonaws.com/workspaces/ws-1234abcd, or empty",
    "(?i)redis|tieredstorage": "redis or tieredstorage",
}
QUANTITY_PATTERN_START = "^(\\+|-)?(([0-9]+(\\.[0-9]*)?)"  # Kubernetes' resource quantity, as CRDs write it


def pattern_hint(pattern: str) -> str | None:
    """The words for a schema pattern, or None for one without them (then the pattern itself is shown)."""
    if pattern.startswith(QUANTITY_PATTERN_START):
        return "a Kubernetes quantity, like 30Gi, 500m or 2"
    return PATTERN_HINTS.get(pattern)


def problems_from_validation(
    error: ValidationError, root: type[BaseModel], prefix: tuple[str | int, ...] = ()
) -> list[SpecProblem]:
    problems = []
    for item in error.errors(include_url=False):
        loc = prefix + tuple(item["loc"])
        kind = item["type"]
        msg = item["msg"]
        if kind == "extra_forbidden":
            parent = _model_at(root, tuple(item["loc"])[:-1])
            allowed = f"; allowed fields: {_allowed_fields(parent)}" if parent else ""
            msg = f"unknown field{allowed}"
        elif kind == "missing":
            msg = "required field is missing"
        elif kind == "literal_error":
            msg = f"got {short_value(item.get('input'))}; allowed values: {item['ctx']['expected']}"
        elif kind == "string_type" and isinstance(item.get("input"), int | float) and \
                not isinstance(item.get("input"), bool):  # YAML read `version: 1` as a number
            msg = (f"expected a string, got the number {item['input']!r}: quote the value as written (unquoted, "
                   "YAML reads 1.10 as the number 1.1)")
        elif kind == "string_pattern_mismatch" and pattern_hint(str((item.get("ctx") or {}).get("pattern", ""))):
            msg = f"expected {pattern_hint(str(item['ctx']['pattern']))} (got {short_value(item.get('input'))})"
        elif kind == "value_error":
            msg = msg.removeprefix("Value error, ")
            loc, msg = _named_inside(root, tuple(item["loc"]), loc, msg)
        else:
            msg = f"{msg} (got {short_value(item.get('input'))})"
        problems.append(SpecProblem(format_path(loc), msg))
    return problems
