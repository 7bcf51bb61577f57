"""The fast lane's refusals (local_replies.BODY_REFUSALS, answered by Envoy) say what the
routing stage says for the same body (filters/errors.py): one wording for both lanes."""

from __future__ import annotations

import json

import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from sluicegate import wire
from sluicegate.filters.errors import body_error
from sluicegate.filters.jsonbody import BodyError, BodyProblem
from sluicegate.local_replies import BodyRefusal, body_refusals

LIMIT = 4096  # admission.max_output_tokens
REFUSALS = body_refusals(LIMIT)
# refusal problem -> the routing stage's (problem, member)
ROUTING_STAGE: dict[str, tuple[BodyProblem, str | None]] = {
    "json": ("json", None),
    "object": ("object", None),
    "model": ("model", None),
    "model_type": ("model_type", None),
    "stream": ("stream", "stream"),
    "n": ("n", "n"),
    **{f"duplicate_{m}": ("duplicate", m) for m in wire.BODY_READ_MEMBERS},
    **{f"max_tokens_{m}": ("max_tokens", m) for m in wire.MAX_TOKENS_MEMBERS},
}


def test_every_refusal_has_a_routing_stage_twin() -> None:
    assert {refusal.problem for refusal in REFUSALS} == set(ROUTING_STAGE)


@pytest.mark.parametrize("refusal", REFUSALS, ids=lambda r: r.problem)
def test_a_refusal_is_worded_as_the_routing_stage_words_it(refusal: BodyRefusal) -> None:
    problem, member = ROUTING_STAGE[refusal.problem]
    error_answer = body_error(BodyError(problem, member), max_output_tokens=LIMIT)
    answer = ep.ProcessingResponse.FromString(error_answer)
    immediate = answer.immediate_response
    error = json.loads(immediate.body)["error"]
    assert immediate.status.code == refusal.status
    assert (error["message"], error["code"], error["param"]) == (
        refusal.message,
        refusal.code,
        refusal.param,
    )
