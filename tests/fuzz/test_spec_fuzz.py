"""The spec loader is total: any document either loads or raises SpecError naming a field, nothing else.

A crash in the loader (TypeError, KeyError, ...) would reach `fleetserve up` as a traceback instead of a
message that names the field; both our format and HyperPod's are fuzzed, from scratch and by mutating the
shipped examples.
"""

from __future__ import annotations

import copy
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetserve.spec import SpecError
from fleetserve.spec.endpoint import API_VERSION
from fleetserve.spec.hyperpod import API_VERSION as HYPERPOD_API_VERSION
from fleetserve.spec.load import LoadedSpec, load_spec_data, load_spec_text

EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.yaml"))
SETTINGS = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.sampled_from(["", "0", "-1", "1e400", "s3://", "hf:", "catalog:x", "redis://", "http://x", "ml.g5.xlarge",
                     "WhenEmpty", "prometheus", "external", "builtin:tiny", "0 9 * * 1-5", "Mars/Olympus", "100%"]),
)
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)), max_leaves=20)
headers = st.sampled_from([(API_VERSION, "Endpoint"), (HYPERPOD_API_VERSION, "InferenceEndpointConfig")])


def loads_or_names_a_field(call) -> None:
    try:
        result = call()
    except SpecError as err:
        assert err.problems and all(isinstance(p.message, str) and p.message for p in err.problems)
        return
    assert isinstance(result, LoadedSpec)


@SETTINGS
@given(data=json_values)
def test_any_value_as_a_document(data):
    loads_or_names_a_field(lambda: load_spec_data(data))


@SETTINGS
@given(header=headers, metadata=json_values, spec=json_values)
def test_any_body_under_a_valid_header(header, metadata, spec):
    doc = {"apiVersion": header[0], "kind": header[1], "metadata": metadata, "spec": spec}
    loads_or_names_a_field(lambda: load_spec_data(doc))


@SETTINGS
@given(text=st.one_of(st.text(max_size=200), st.builds(lambda v: yaml.safe_dump(v), json_values)))
def test_any_text(text):
    loads_or_names_a_field(lambda: load_spec_text(text))


def _paths(node, prefix=()):
    """Every path into a document (dict keys and list indexes), the root included."""
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _paths(value, (*prefix, i))


def _mutate(doc, path, action: str, value):
    if not path:
        return value
    parent = doc
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    if action == "delete" and isinstance(parent, dict):
        del parent[last]
    elif action == "add" and isinstance(parent, dict):
        parent[str(value)[:10] or "x"] = value
    elif action == "wrap":
        parent[last] = [parent[last]]
    else:
        parent[last] = value
    return doc


@st.composite
def mutated_examples(draw):
    example = draw(st.sampled_from(EXAMPLES))
    doc = yaml.safe_load(example.read_text())
    for _ in range(draw(st.integers(1, 3))):
        paths = list(_paths(doc))
        path = draw(st.sampled_from(paths[1:] if len(paths) > 1 else paths))
        doc = _mutate(copy.deepcopy(doc), path, draw(st.sampled_from(["replace", "delete", "add", "wrap"])),
                      draw(json_values))
    return example.name, doc


def test_the_examples_load():
    assert EXAMPLES, "examples/*.yaml are the mutation seeds"
    for example in EXAMPLES:
        assert isinstance(load_spec_text(example.read_text()), LoadedSpec), example


@settings(SETTINGS, max_examples=300)
@given(case=mutated_examples())
def test_mutated_examples(case):
    _, doc = case
    loads_or_names_a_field(lambda: load_spec_data(doc))
    loads_or_names_a_field(lambda: load_spec_text(yaml.safe_dump(doc)))


CONFUSIONS = [None, [], {}, "x", -1, 2**70, 1.5, True, [{}], {"x": None}]


def test_every_field_of_every_example_confused():
    """A deterministic sweep the random mutations may miss: each path of each example gets each wrong type."""
    for example in EXAMPLES:
        original = yaml.safe_load(example.read_text())
        for path in list(_paths(original))[1:]:
            for value in CONFUSIONS:
                doc = _mutate(copy.deepcopy(original), path, "replace", value)
                try:
                    loads_or_names_a_field(lambda d=doc: load_spec_data(d))
                except Exception as exc:
                    raise AssertionError(f"{example.name}: {'.'.join(map(str, path))} = {value!r}: {exc!r}") from exc
