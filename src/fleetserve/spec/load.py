"""Read a spec file (ours or HyperPod's), validate it and collect the warnings a user must see."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from fleetserve.spec import hyperpod
from fleetserve.spec.effects import inert_settings
from fleetserve.spec.endpoint import API_VERSION, Endpoint
from fleetserve.spec.errors import SpecError, SpecProblem, problems_from_validation
from fleetserve.spec.exported import without_server_fields
from fleetserve.spec.strict_yaml import load_strict

ACCEPTED = {
    API_VERSION: "Endpoint",
    **{version: hyperpod.KIND for version in hyperpod.API_VERSIONS},
}
# HyperPod kinds of the same API group that are not an endpoint spec fleetserve can read: what to write instead
NOT_READ = {
    "JumpStartModel": "a SageMaker JumpStart hub model, whose weights only SageMaker can fetch, is not supported; "
                      "write it as an InferenceEndpointConfig whose modelSourceConfig names the weights (s3, fsx, "
                      "huggingface), or as a fleetserve.io/v1 Endpoint with model.source catalog:NAME",
}


def _accepted() -> str:
    """`fleetserve.io/v1 (kind Endpoint), inference.sagemaker.aws.amazon.com/v1 or v1alpha1 (kind ...)`."""
    by_kind: dict[str, list[str]] = {}
    for version, kind in ACCEPTED.items():
        by_kind.setdefault(kind, []).append(version)
    return ", ".join(versions[0] + "".join(f" or {v.rsplit('/', 1)[1]}" for v in versions[1:]) + f" (kind {kind})"
                     for kind, versions in by_kind.items())


@dataclass(frozen=True)
class LoadedSpec:
    endpoint: Endpoint
    source_format: str  # "fleetserve" or "hyperpod"
    warnings: list[SpecProblem] = field(default_factory=list)
    document: dict | None = field(default=None, compare=False, repr=False)  # as written: names a HyperPod field


def load_spec_text(text: str, source: str | None = None) -> LoadedSpec:
    try:
        data = load_strict(text)
    except yaml.YAMLError as exc:
        raise SpecError([SpecProblem("", f"not valid YAML: {exc}")], source) from None
    return load_spec_data(data, source)


MAX_SPEC_BYTES = 16 << 20  # a spec is a page of YAML: a model file given by mistake was read whole (1.1 GB)


def load_spec(path: str | Path) -> LoadedSpec:
    p = Path(path)
    if p.is_dir():
        raise SpecError([SpecProblem("", f"{p} is a directory, not a spec file")], str(p))
    try:
        # at most one byte past the cap, from a pipe too (`validate <(envsubst < spec.yaml)`): /dev/zero had been
        # read until memory ran out
        with open(p, "rb") as f:
            raw = f.read(MAX_SPEC_BYTES + 1)
        if len(raw) > MAX_SPEC_BYTES:
            raise SpecError([SpecProblem("", f"{p} holds more than {MAX_SPEC_BYTES} bytes; a spec file is far "
                                             "smaller (is it the spec?)")], str(p))
        text = raw.decode("utf-8-sig")
    except OSError as exc:
        raise SpecError([SpecProblem("", f"cannot read {p}: {exc.strerror}")], str(p)) from None
    except UnicodeDecodeError as exc:
        raise SpecError([SpecProblem("", f"{p} is not UTF-8 text ({exc.reason} at byte {exc.start})")],
                        str(p)) from None
    return load_spec_text(text, str(p))


def load_spec_data(data: Any, source: str | None = None) -> LoadedSpec:
    if not isinstance(data, dict):
        raise SpecError([SpecProblem("", "the document must be a YAML mapping with apiVersion, kind, spec")], source)
    api_version, kind = data.get("apiVersion"), data.get("kind")
    if not isinstance(api_version, str) or api_version not in ACCEPTED:  # a list or mapping is unhashable
        raise SpecError([SpecProblem("apiVersion", f"got {api_version!r}; allowed: {_accepted()}")], source)
    if kind != ACCEPTED[api_version]:
        why = NOT_READ.get(kind) if isinstance(kind, str) and api_version in hyperpod.API_VERSIONS else None
        said = f"{kind}: {why}" if why else f"got {kind!r}; allowed value for {api_version}: {ACCEPTED[api_version]!r}"
        raise SpecError([SpecProblem("kind", said)], source)
    data, exported = without_server_fields(data)
    notes: list[SpecProblem] = []
    if exported:
        notes.append(SpecProblem(exported[0], "ignored, as the API server and kubectl wrote them (a resource "
                                              f"exported from a cluster): {', '.join(exported)}", everywhere=True))
    fmt = "fleetserve"
    written = data  # the user's own document: a HyperPod spec's problems are named by its fields
    if api_version in hyperpod.API_VERSIONS:
        written = hyperpod.without_nulls(data)  # as the API server stores it: `useCachedMetrics:` left empty is unset
        try:
            data, parsed = hyperpod.parse(data)
            notes += parsed
        except SpecError as exc:
            raise SpecError(exc.problems, source) from None
        fmt = "hyperpod"
    try:
        endpoint = Endpoint.model_validate(data, by_alias=True, by_name=False)
    except ValidationError as exc:
        problems = problems_from_validation(exc, Endpoint)
        if fmt == "hyperpod":
            problems = [hyperpod.source_of(p, written) or p for p in problems]
        raise SpecError(problems, source) from None
    inert = inert_settings(endpoint)
    if fmt == "hyperpod":  # named by the user's own fields, as its errors are (our path in the message)
        inert = [n for n in (hyperpod.source_of(w, written) for w in inert) if n is not None]
    return LoadedSpec(endpoint, fmt, notes + inert, written)
