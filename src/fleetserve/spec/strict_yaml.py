"""YAML for specs: a key given twice in one mapping is an error, not a silent last-one-wins.

PyYAML keeps the last of two equal keys without a word, so a spec with `replicas: 1` and, further down the
same mapping, `replicas: 3` ran with 3 and the first line read as the truth. Kubernetes' own decoder
(sigs.k8s.io/yaml, strict) refuses such a document; so do we, naming the key and both lines.

Numbers are read as Kubernetes reads them (YAML 1.2, JSON's numbers): PyYAML's YAML 1.1 took `1e6` (no dot) for a
string, which a number field had coerced; now that a quoted number is refused there (`replicas: "3"`, which the
CRD refuses), `1e6` must be the number it is to Kubernetes.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

_Base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping that gives one key twice."""


class _StrictLoader(_Base):  # type: ignore[misc, valid-type]
    pass


def _mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    first: dict[Any, yaml.Node] = {}
    for key_node, _value in node.value:  # the mapping's own keys: one merged in (<<) may be overridden
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            seen = first.get(key)
        except TypeError:
            continue  # an unhashable key: construct_mapping names it below
        if seen is not None:
            raise DuplicateKeyError(
                None, None,
                f"key {key!r} given twice in one mapping (line {seen.start_mark.line + 1} and line "
                f"{key_node.start_mark.line + 1}); keep one")
        first[key] = key_node
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)
# after YAML 1.1's own: `1e6` and `-2E-3`, which 1.1 leaves strings (1.1's int and float take the rest first)
_StrictLoader.add_implicit_resolver("tag:yaml.org,2002:float",
                                    re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$"),
                                    list("-+0123456789."))


def load_strict(text: str) -> Any:
    """The document in `text`, refusing duplicate mapping keys (yaml.YAMLError with the lines)."""
    return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 (a safe loader)
