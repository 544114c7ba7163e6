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


MAX_VALUES = 100_000  # a spec's values once its aliases are expanded: a real one has a few hundred


def load_strict(text: str) -> Any:
    """The document in `text`, refusing duplicate mapping keys (yaml.YAMLError with the lines) and documents whose
    aliases expand to more than MAX_VALUES values: nine lists of nine, nine deep (a "billion laughs") parse in a
    millisecond, by reference, and then took every reader that walks them (the field checks, HyperPod's
    translation, an error's echo of the value) minutes."""
    data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 (a safe loader)
    if expanded_size(data, MAX_VALUES) > MAX_VALUES:
        raise yaml.YAMLError(f"the document expands to more than {MAX_VALUES:,} values through its aliases "
                             "(&anchor and *alias); a spec is far smaller")
    return data


def expanded_size(data: Any, stop: int) -> int:
    """How many values `data` holds with every shared list or mapping counted each time it appears, in time linear
    in the distinct ones (each one's size is computed once); past `stop` it stops counting."""
    sizes: dict[int, int] = {}
    order: list[Any] = []  # containers, parents before children; sized children first, below
    pending = [data]
    while pending:
        value = pending.pop()
        if not isinstance(value, list | dict) or id(value) in sizes:
            continue
        sizes[id(value)] = 0  # seen (a recursive alias is counted once)
        order.append(value)
        pending.extend(value.values() if isinstance(value, dict) else value)
    for value in reversed(order):
        items = value.values() if isinstance(value, dict) else value
        total = 1 + len(value) + sum(sizes.get(id(item), 0) for item in items if isinstance(item, list | dict))
        sizes[id(value)] = min(total, stop + 1)
    return sizes.get(id(data), 1)
