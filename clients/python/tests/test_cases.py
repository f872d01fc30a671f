"""The Python client's copy of the wire contract against ``protocol/cases.json``: the
table the Rust protocol crate's own tests check its definitions against. When the two
copies of the header names, the token rule or the scope rule drift apart, one of these
tests fails.

No server is needed: these are pure functions and constants.
"""

import json
from pathlib import Path

import pytest

import palisade

#: ``clients/python/tests/`` -> the repository root.
CASES = Path(__file__).resolve().parents[3] / "protocol" / "cases.json"


def load_cases():
    with CASES.open(encoding="utf-8") as f:
        return json.load(f)


def test_header_names_match_the_shared_table():
    """Goal: every header name the table fixes is spelled the same here.
    Method: compare each of the table's names, case-insensitively (HTTP header names are)."""
    headers = load_cases()["headers"]
    ours = {
        "token": palisade.FENCING_TOKEN,
        "scope": palisade.FENCING_SCOPE,
        "current": palisade.FENCING_TOKEN_CURRENT,
        "proof": palisade.FENCING_TOKEN_PROOF,
    }
    assert set(headers) == set(ours), "the table and the client name different headers"
    for key, name in headers.items():
        assert ours[key].lower() == name.lower(), key


def test_token_parsing_matches_the_shared_table():
    """Goal: exactly the table's tokens parse, to the table's values; the rest are refused.
    Method: parse every case's text and compare with its expected token (null: refused)."""
    cases = load_cases()["tokens"]
    assert len(cases) >= 8, f"the table has only {len(cases)} token cases"
    for case in cases:
        assert palisade.parse_token(case["text"]) == case["token"], repr(case["text"])


def test_scope_rule_matches_the_shared_table():
    """Goal: the scope rule accepts exactly the table's valid scopes.
    Method: check every case, and that the client refuses an invalid one at construction."""
    cases = load_cases()["scopes"]
    assert len(cases) >= 8, f"the table has only {len(cases)} scope cases"
    assert any(c["valid"] for c in cases) and any(not c["valid"] for c in cases)
    for case in cases:
        assert palisade.valid_scope(case["name"]) == case["valid"], repr(case["name"])
    invalid = next(c["name"] for c in cases if not c["valid"])
    with pytest.raises(ValueError):
        palisade.FencedClient("http://127.0.0.1:1", 1, scope=invalid)
