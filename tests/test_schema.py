"""dispatch.schema.json and the runtime's dependency-free validator agree with the jsonschema package."""
import copy
import json

import pytest

from runtime_loader.schema import SCHEMA_PATH, dispatch_schema, validate_dispatch

from .tables import table

jsonschema = pytest.importorskip("jsonschema")


def mutations():
    base = table()
    yield "valid", base
    cases = {
        "schema_version": lambda t: t.update(schema_version="1"),
        "tp_zero": lambda t: t["model"].update(tp=0),
        "bad_dtype": lambda t: t["model"].update(dtype="int8"),
        "bad_mode": lambda t: t.update(timing_mode="fast"),
        "bucket_str": lambda t: t["buckets"]["norm.rms"].update(tokens=["1"]),
        "hash_short": lambda t: t.update(capabilities_hash="abc"),
        "kernel_no_version": lambda t: t["kernels"]["sdpa.math"].pop("version"),
        "leaf_bad_id": lambda t: t["ops"][1]["tree"].update(kernel_id="os.system('x')"),
        "split_no_gt": lambda t: t["ops"][0]["tree"].pop("gt"),
        "threshold_str": lambda t: t["ops"][0]["tree"].update(threshold="8"),
        "ops_not_list": lambda t: t.update(ops={}),
        "jit_archive_escape": lambda t: t.update(jit={"archive": "jit/../../etc/passwd", "caches": []}),
        "missing_hardware": lambda t: t.pop("hardware"),
        "static_bool": lambda t: t["ops"][0]["static"].update(hidden=True),  # numbers (softcap=50.0) and strings only
        "schema_version_true": lambda t: t.update(schema_version=True),  # == 1 to Python, not to JSON
    }
    for name, mutate in cases.items():
        t = copy.deepcopy(base)
        mutate(t)
        yield name, t


def test_the_schema_is_valid_json_schema():
    jsonschema.Draft202012Validator.check_schema(json.loads(SCHEMA_PATH.read_text()))


@pytest.mark.parametrize("name,raw", list(mutations()), ids=[n for n, _ in mutations()])
def test_mini_validator_agrees_with_jsonschema(name, raw):
    reference = sorted(e.message for e in jsonschema.Draft202012Validator(dispatch_schema()).iter_errors(raw))
    ours = validate_dispatch(raw)
    assert bool(reference) == bool(ours), (reference, ours)
    assert bool(ours) == (name != "valid")
