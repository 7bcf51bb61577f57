"""Reading a request body for admission: find_members, inspect_request, the 400 answers."""

from __future__ import annotations

import json
from typing import Any, get_args

import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from sluicegate.filters import errors
from sluicegate.filters.estimate import estimate_text_tokens
from sluicegate.filters.jsonbody import BodyError, BodyProblem, find_member, find_members
from sluicegate.filters.request_facts import RequestFacts, inspect_request

LIMIT = 4096


def facts(document: dict[str, Any] | bytes, limit: int = LIMIT) -> RequestFacts:
    body = document if isinstance(document, bytes) else json.dumps(document).encode()
    return inspect_request(body, max_output_tokens=limit)


def problem(document: dict[str, Any] | bytes) -> tuple[str, str | None]:
    with pytest.raises(BodyError) as caught:
        facts(document)
    return caught.value.problem, caught.value.member


# ----- find_members ------------------------------------------------------------------------


def test_find_members_returns_the_wanted_members_with_their_spans():
    text = ' {"a": 1, "b": [1, {"x": 2}], "c" :"z", "d": null}\n'
    members = find_members(text, frozenset(("b", "c", "d", "missing")))
    assert set(members) == {"b", "c", "d"}
    for name, member in members.items():
        assert json.loads(text[member.start : member.end]) == member.value
        assert member.value == json.loads(text)[name]


def test_find_members_names_the_duplicate():
    with pytest.raises(BodyError) as caught:
        find_members('{"a": 1, "n": 1, "b": 2, "n": 2}', frozenset(("a", "n")))
    assert (caught.value.problem, caught.value.member) == ("duplicate", "n")


def test_duplicates_of_other_members_are_allowed():
    members = find_members('{"x": 1, "x": 2, "a": 3}', frozenset(("a",)))
    assert members["a"].value == 3


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{"a": 1, "a": 2', "json"),  # invalid JSON wins over a duplicate seen before the error
        ('{"a": 1, "a": 2,}', "json"),
        ('{"a": 1, "a": 2} x', "json"),
        ("[1]", "object"),
        ("", "json"),
        ("  ", "json"),
        ("[" * 100_000, "json"),  # too deep for the scanner: still only a BodyError
    ],
)
def test_find_members_errors(text: str, problem: str):
    with pytest.raises(BodyError) as caught:
        find_members(text, frozenset(("a",)))
    assert caught.value.problem == problem


def test_find_member_is_find_members_for_one_key():
    text = '{"model": "m", "x": 1}'
    member = find_member(text, "model")
    assert member is not None
    assert member == find_members(text, frozenset(("model",)))["model"]
    assert find_member(text, "absent") is None


# ----- inspect_request: valid bodies ---------------------------------------------------------


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        ({"model": "m"}, ("m", False, False, None, 1)),
        ({"model": "m", "stream": True}, ("m", True, False, None, 1)),
        (
            {"model": "m", "stream": True, "stream_options": {"include_usage": True}},
            ("m", True, True, None, 1),
        ),
        ({"model": "m", "stream_options": {"include_usage": False}}, ("m", False, False, None, 1)),
        ({"model": "m", "stream_options": {}}, ("m", False, False, None, 1)),
        ({"model": "m", "stream_options": None, "stream": None}, ("m", False, False, None, 1)),
        ({"model": "m", "max_tokens": 10}, ("m", False, False, 10, 1)),
        ({"model": "m", "max_completion_tokens": 20}, ("m", False, False, 20, 1)),
        (
            {"model": "m", "max_tokens": 10, "max_completion_tokens": 20},
            ("m", False, False, 20, 1),
        ),
        ({"model": "m", "max_completion_tokens": None, "max_tokens": 7}, ("m", False, False, 7, 1)),
        ({"model": "m", "max_output_tokens": 30}, ("m", False, False, 30, 1)),
        ({"model": "m", "max_tokens": None}, ("m", False, False, None, 1)),
        ({"model": "m", "max_tokens": LIMIT}, ("m", False, False, LIMIT, 1)),
        ({"model": "m", "n": 3}, ("m", False, False, None, 3)),
        ({"model": "m", "n": 128}, ("m", False, False, None, 128)),
        ({"model": "m", "n": None}, ("m", False, False, None, 1)),
        ({"model": "модель", "extra": {"n": "ignored"}}, ("модель", False, False, None, 1)),
    ],
)
def test_valid_bodies(document: dict[str, Any], expected: tuple[Any, ...]):
    got = facts(document)
    assert (got.model, got.stream, got.include_usage, got.max_tokens, got.n) == expected


def test_whitespace_and_escapes_are_read_like_json_loads():
    body = b' {\n "model" : "gpt\\u002d4o",\r\n\t"stream":true , "n" : 2 }  '
    got = facts(body)
    assert (got.model, got.stream, got.n) == ("gpt-4o", True, 2)


@pytest.mark.parametrize(
    ("document", "members"),
    [
        ({"model": "m"}, []),
        ({"model": "m", "messages": [{"role": "user", "content": "Hello there"}]}, ["messages"]),
        ({"model": "m", "prompt": "Once upon a time"}, ["prompt"]),
        (
            {"model": "m", "input": ["a", "b"], "instructions": "Be brief."},
            ["input", "instructions"],
        ),
        (
            {
                "model": "m",
                "messages": [{"role": "user", "content": "天气怎么样"}],
                "tools": [{"type": "function", "function": {"name": "weather"}}],
                "functions": [{"name": "legacy"}],
                "temperature": 0.5,
            },
            ["messages", "tools", "functions"],
        ),
    ],
)
@pytest.mark.parametrize("ensure_ascii", [True, False])
def test_prompt_tokens_are_estimated_over_the_prompt_members(
    document: dict[str, Any], members: list[str], ensure_ascii: bool
):
    body = json.dumps(document, ensure_ascii=ensure_ascii)
    expected = estimate_text_tokens(
        "".join(json.dumps(document[m], ensure_ascii=ensure_ascii) for m in members)
    )
    assert facts(body.encode()).prompt_tokens == expected


def test_cjk_counts_about_one_token_a_character_escaped_or_not():
    text = "日本語のテキスト" * 50  # 400 characters
    raw = facts(json.dumps({"model": "m", "prompt": text}, ensure_ascii=False).encode())
    escaped = facts(json.dumps({"model": "m", "prompt": text}).encode())
    assert 400 <= raw.prompt_tokens <= 401
    assert 600 <= escaped.prompt_tokens <= 601


# ----- inspect_request: refused bodies -------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"\xff{}", ("json", None)),
        (b"{", ("json", None)),
        (b'{"model": "m",}', ("json", None)),
        (b"[]", ("object", None)),
        (b'"model"', ("object", None)),
        (b'{"model": "m", "model": "m"}', ("duplicate", "model")),
        (b'{"model": "m", "stream": true, "stream": false}', ("duplicate", "stream")),
        (b'{"model": "m", "messages": [], "messages": []}', ("duplicate", "messages")),
        (b'{"model": "m", "max_tokens": 1, "max_tokens": 1}', ("duplicate", "max_tokens")),
    ],
)
def test_unreadable_bodies(body: bytes, expected: tuple[str, str | None]):
    assert problem(body) == expected


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        ({}, ("model", "model")),
        ({"model": ""}, ("model", "model")),
        ({"messages": []}, ("model", "model")),
        ({"model": None}, ("model_type", "model")),
        ({"model": 4}, ("model_type", "model")),
        ({"model": ["m"]}, ("model_type", "model")),
        ({"model": "m", "max_tokens": 3.0}, ("max_tokens", "max_tokens")),
        ({"model": "m", "max_tokens": True}, ("max_tokens", "max_tokens")),
        ({"model": "m", "max_tokens": "10"}, ("max_tokens", "max_tokens")),
        ({"model": "m", "max_tokens": 0}, ("max_tokens", "max_tokens")),
        ({"model": "m", "max_tokens": -5}, ("max_tokens", "max_tokens")),
        ({"model": "m", "max_tokens": LIMIT + 1}, ("max_tokens", "max_tokens")),
        ({"model": "m", "max_tokens": 10**30}, ("max_tokens", "max_tokens")),
        ({"model": "m", "max_completion_tokens": 0.5}, ("max_tokens", "max_completion_tokens")),
        ({"model": "m", "max_completion_tokens": False}, ("max_tokens", "max_completion_tokens")),
        ({"model": "m", "max_output_tokens": 0}, ("max_tokens", "max_output_tokens")),
        # every spelling sent is checked, not only the one used
        (
            {"model": "m", "max_completion_tokens": 10, "max_tokens": 0},
            ("max_tokens", "max_tokens"),
        ),
        ({"model": "m", "n": 0}, ("n", "n")),
        ({"model": "m", "n": 129}, ("n", "n")),
        ({"model": "m", "n": 2.0}, ("n", "n")),
        ({"model": "m", "n": True}, ("n", "n")),
        ({"model": "m", "n": "2"}, ("n", "n")),
        ({"model": "m", "stream": 1}, ("stream", "stream")),
        ({"model": "m", "stream": "true"}, ("stream", "stream")),
        ({"model": "m", "stream_options": True}, ("stream_options", "stream_options")),
        ({"model": "m", "stream_options": []}, ("stream_options", "stream_options")),
        (
            {"model": "m", "stream_options": {"include_usage": 1}},
            ("stream_options", "stream_options"),
        ),
        # the model is checked first, as the routing stage does
        ({"model": 1, "n": 0}, ("model_type", "model")),
    ],
)
def test_refused_parameters(document: dict[str, Any], expected: tuple[str, str | None]):
    assert problem(document) == expected


def test_non_finite_numbers_are_not_integers():
    for body in (b'{"model":"m","max_tokens":NaN}', b'{"model":"m","n":Infinity}'):
        assert problem(body)[0] in ("max_tokens", "n")
    assert problem(b'{"model":"m","max_tokens":1e400}') == ("max_tokens", "max_tokens")


def test_the_limit_is_the_callers():
    assert facts({"model": "m", "max_tokens": 100}, limit=100).max_tokens == 100
    with pytest.raises(BodyError):
        facts({"model": "m", "max_tokens": 101}, limit=100)


# ----- the 400 answers -----------------------------------------------------------------------


def answer(raw: bytes) -> tuple[int, dict[str, Any]]:
    immediate = ep.ProcessingResponse.FromString(raw).immediate_response
    return immediate.status.code, json.loads(immediate.body)["error"]


def test_every_problem_has_an_answer():
    assert set(errors.BODY_PROBLEMS) == set(get_args(BodyProblem))
    for raw in errors.BODY_PROBLEMS.values():
        status, error = answer(raw)
        assert status == 400
        assert error["type"] == "invalid_request_error"
        assert error["message"]


def test_existing_answers_are_kept_for_the_model_problems():
    assert errors.BODY_PROBLEMS["model"] is errors.MISSING_MODEL
    assert errors.BODY_PROBLEMS["model_type"] is errors.MODEL_NOT_STRING
    assert errors.BODY_PROBLEMS["duplicate"] is errors.DUPLICATE_MODEL


@pytest.mark.parametrize(
    ("problem_name", "param", "code", "says"),
    [
        ("max_tokens", "max_tokens", "invalid_value", "integer of at least 1"),
        ("n", "n", "invalid_value", "from 1 to 128"),
        ("stream", "stream", "invalid_type", "boolean"),
        ("stream_options", "stream_options", "invalid_type", "include_usage"),
    ],
)
def test_new_answers(problem_name: BodyProblem, param: str, code: str, says: str):
    _, error = answer(errors.BODY_PROBLEMS[problem_name])
    assert (error["param"], error["code"]) == (param, code)
    assert says in error["message"]


@pytest.mark.parametrize(
    ("exc", "limit", "param", "code", "says"),
    [
        (BodyError("duplicate", "n"), None, "n", "duplicate_parameter", "'n' parameter"),
        (BodyError("duplicate", "model"), None, "model", "duplicate_parameter", "'model'"),
        (BodyError("duplicate"), None, "model", "duplicate_parameter", "'model'"),
        (BodyError("max_tokens", "max_tokens"), 4096, "max_tokens", "invalid_value", "1 to 4096"),
        (
            BodyError("max_tokens", "max_completion_tokens"),
            None,
            "max_completion_tokens",
            "invalid_value",
            "'max_completion_tokens'",
        ),
        (
            BodyError("max_tokens", "max_output_tokens"),
            100,
            "max_output_tokens",
            "invalid_value",
            "from 1 to 100",
        ),
        (BodyError("n", "n"), 100, "n", "invalid_value", "from 1 to 128"),
    ],
)
def test_body_error_names_the_member_sent(
    exc: BodyError, limit: int | None, param: str, code: str, says: str
):
    status, error = answer(errors.body_error(exc, max_output_tokens=limit))
    assert status == 400
    assert (error["param"], error["code"]) == (param, code)
    assert says in error["message"]


def test_body_error_falls_back_to_the_prebuilt_answers():
    for name in get_args(BodyProblem):
        if name not in ("duplicate", "max_tokens"):
            assert errors.body_error(BodyError(name)) is errors.BODY_PROBLEMS[name]
    assert errors.body_error(BodyError("max_tokens")) is errors.INVALID_MAX_TOKENS
