"""Block keys never let two different prefixes, tenants or client salts share a cache entry.

Equal keys are how every tier (engine blocks, L1, L2) and the router's index decide "same prefix", so a
collision by construction (not by a 64-bit accident) is a cross-tenant leak or a wrong answer.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetserve.kvcache.blocks import chain_keys, kv_salt, namespace_key, text_chunk_keys

SETTINGS = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))
# The separator and the namespace prefixes are the interesting characters: draw them often.
fragments = st.sampled_from(["a", "b", "\0", ":", "\\", "\\0", "tenant:", "client:", "\ud800", "é"])
names = st.one_of(st.none(), st.lists(fragments, max_size=5).map("".join), st.text(max_size=8))
tokens = st.lists(st.integers(min_value=0, max_value=2**31 - 1), max_size=40)
block_sizes = st.integers(min_value=1, max_value=8)


def _effective(tenant, client):
    """kv_salt treats "" like None: neither separates anything."""
    return (tenant or None, client or None)


@SETTINGS
@given(a=st.tuples(names, names), b=st.tuples(names, names))
def test_different_tenant_and_client_salt_pairs_never_share_a_root(a, b):
    if _effective(*a) == _effective(*b):
        assert kv_salt(*a) == kv_salt(*b)
        assert namespace_key("m", "1", "f", kv_salt(*a)) == namespace_key("m", "1", "f", kv_salt(*b))
    else:
        assert kv_salt(*a) != kv_salt(*b), (a, b)
        assert namespace_key("m", "1", "f", kv_salt(*a)) != namespace_key("m", "1", "f", kv_salt(*b)), (a, b)


def test_a_tenant_is_never_a_client_salt_of_the_same_name():
    assert kv_salt("a", None) != kv_salt(None, "a")
    assert kv_salt("a\0client:b", None) != kv_salt("a", "b")
    assert kv_salt(None, "x\0tenant:y") != kv_salt("y", "x")


@SETTINGS
@given(a=st.tuples(names, names, names), b=st.tuples(names, names, names))
def test_model_version_and_dtype_namespaces_are_separate(a, b):
    a, b = tuple(x or "" for x in a), tuple(x or "" for x in b)
    assert (namespace_key(*a) == namespace_key(*b)) == (a == b), (a, b)


@SETTINGS
@given(a=tokens, b=tokens, size=block_sizes, root=st.integers(min_value=0, max_value=2**64 - 1))
def test_chain_keys_are_equal_exactly_for_equal_prefixes(a, b, size, root):
    keys_a, keys_b = chain_keys(a, size, root), chain_keys(b, size, root)
    assert len(keys_a) == len(a) // size
    assert keys_a == chain_keys(list(a), size, root)  # deterministic
    for i, (ka, kb) in enumerate(zip(keys_a, keys_b, strict=False)):
        end = (i + 1) * size
        assert (ka == kb) == (a[:end] == b[:end]), (i, a[:end], b[:end])


@SETTINGS
@given(prefix=tokens.filter(bool), size=block_sizes, roots=st.lists(st.integers(0, 2**64 - 1), min_size=2,
                                                                        max_size=2, unique=True))
def test_the_same_prefix_under_two_roots_shares_no_key(prefix, size, roots):
    prefix = (prefix * size)[: max(size, len(prefix))]
    assert set(chain_keys(prefix, size, roots[0])).isdisjoint(chain_keys(prefix, size, roots[1]))


@SETTINGS
@given(a=st.text(max_size=40), b=st.text(max_size=40), size=st.integers(1, 8))
def test_text_chunk_keys_follow_the_bytes(a, b, size):
    keys_a, keys_b = text_chunk_keys(a, size), text_chunk_keys(b, size)
    assert keys_a == text_chunk_keys(a, size)
    da, db = a.encode("utf-8", "surrogatepass"), b.encode("utf-8", "surrogatepass")
    for i, (ka, kb) in enumerate(zip(keys_a, keys_b, strict=False)):
        end = (i + 1) * size
        assert (ka == kb) == (da[:end] == db[:end])


@SETTINGS
@given(x=names, y=names, sep=st.sampled_from(["\0client:", "\0tenant:", "\\0client:", "\0"]))
def test_a_field_that_spells_the_separator_is_not_two_fields(x, y, sep):
    x, y = x or "a", y or "b"
    assert kv_salt(x + sep + y) != kv_salt(x, y)
    assert kv_salt(None, y + sep + x) != kv_salt(x, y)
    assert kv_salt(x, y + sep) != kv_salt(x + sep, y) or sep == ""
