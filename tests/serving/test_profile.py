"""The profile contract with the CRD: parsing, errors naming the field, the OpenAPI schema."""

import copy

import pytest

from flotilla.serving.profile import OPENAPI_SCHEMA, Profile, ProfileError, resolve_profile
from flotilla.serving.shipped_profiles import OPT_13B_A100, SHIPPED_PROFILES

INLINE = {
    "name": "tiny",
    "prefill": [{"gpus": 1, "constantMs": 10, "perTokenMs": 0.1, "perTokenSquaredMs": 0.0001}],
    "decode": [{"gpus": 1, "constantMs": 20, "perRequestMs": 0.5, "perContextTokenMs": 0.001,
                "kvCacheTokens": 10000}],
}


@pytest.mark.parametrize("profile", list(SHIPPED_PROFILES.values()), ids=list(SHIPPED_PROFILES))
def test_shipped_profiles_round_trip(profile):
    assert Profile.from_dict(profile.to_dict()) == profile
    assert resolve_profile({"name": profile.name}) is profile
    assert "DistServe" in profile.provenance


def test_inline_profile_resolves_with_defaults():
    profile = resolve_profile(INLINE)
    assert profile.name == "tiny"
    assert profile.prefill_fit(1).max_batch_tokens == 4096
    assert profile.decode_fit(1).max_batch_size == 256
    assert profile.decode_fit(1).kv_cache_tokens == 10000


def _edit(path, value):
    data = copy.deepcopy(INLINE)
    target = data
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return data


@pytest.mark.parametrize("data, field", [
    (_edit(("prefill", 0, "gpus"), KeyError), "profile.prefill[0].gpus: required"),
    (_edit(("decode", 0, "constantMs"), -1), "profile.decode[0].constantMs: must be >= 0"),
    (_edit(("decode", 0, "kvCacheTokens"), 1.5), "profile.decode[0].kvCacheTokens: must be a positive integer"),
    (_edit(("prefill", 0, "perTokenMs"), True), "profile.prefill[0].perTokenMs: must be a number"),
    (_edit(("prefill", 0, "perTokenMS"), 1), "profile.prefill[0].perTokenMS: unknown field"),
    (_edit(("decode",), {"gpus": 1}), "profile.decode: must be a list"),
    (_edit(("decode",), []), "profile.decode: at least one entry"),
    (_edit(("prefill",), INLINE["prefill"] * 2), "profile.prefill: gpus values must be unique"),
    (_edit(("decode",), KeyError), "profile.decode: required"),
    (_edit(("decode", 0, "constantMs"), 0), None),  # 0 constant is fine, the step still costs
])
def test_bad_inline_profile_names_the_field(data, field):
    if field is None:
        resolve_profile(data)
        return
    with pytest.raises(ProfileError) as err:
        resolve_profile(data)
    assert field in str(err.value)


@pytest.mark.parametrize("data, message", [
    ({"name": "gpt-17"}, "profile.name: unknown profile 'gpt-17'"),
    ({}, "profile: give a shipped profile name or inline"),
    ({"name": 3}, "profile.name: must be a string"),
    ("opt-13b-a100", "profile: must be an object"),
])
def test_bad_reference_names_the_field(data, message):
    with pytest.raises(ProfileError) as err:
        resolve_profile(data)
    assert message in str(err.value)


def _walk(schema, path="profile"):
    yield path, schema
    for key, sub in schema.get("properties", {}).items():
        yield from _walk(sub, f"{path}.{key}")
    if "items" in schema:
        yield from _walk(schema["items"], f"{path}[]")


def test_openapi_schema_is_structural_and_matches_the_dataclass():
    for path, node in _walk(OPENAPI_SCHEMA):
        assert "type" in node, path  # structural: every node has a type
        assert "anyOf" not in node and "oneOf" not in node, path
        for name in node.get("required", []):
            assert name in node["properties"], (path, name)
    rules = [v["rule"] for v in OPENAPI_SCHEMA["x-kubernetes-validations"]]
    assert "has(self.name) || (has(self.prefill) && has(self.decode))" in rules
    assert all(v["message"] for v in OPENAPI_SCHEMA["x-kubernetes-validations"])
    # Everything to_dict writes is a field the schema knows, and every required field is written.
    written = OPT_13B_A100.to_dict()
    props = OPENAPI_SCHEMA["properties"]
    assert set(written) <= set(props)
    for phase in ("prefill", "decode"):
        item = props[phase]["items"]
        assert props[phase]["x-kubernetes-list-map-keys"] == ["gpus"]
        for entry in written[phase]:
            # an optional limit left unset (decode maxBatchTokens: the KV capacity) is not written
            assert set(item["required"]) <= set(entry) <= set(item["properties"])
