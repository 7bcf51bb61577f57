"""The native usage reader's glue to Envoy (sluicegate/native/c/usage_filter.c), against a
mock of Envoy's side of the ABI (glue_harness.c, which includes usage_filter.c whole),
built with gcc here, with AddressSanitizer and UBSan when gcc has them.

The harness drives the hooks as Envoy does: bodies in chunks of one to a hundred slices
(empty ones without a pointer), empty data frames mid-stream, a stream ended with its last
data, by an empty data frame (as Envoy's HTTP/1 codec ends every chunked body) or by
trailers; headers-only answers; a chunk whose slices Envoy refuses. What the client gets
is compared with the scanner alone over the whole body (and, after a `data: [DONE]`
line, where the cut depends on the chunking, with the body less at most one run).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Final

import pytest

from sluicegate import wire
from sluicegate.native import MODULE, build
from sluicegate.xds.translate.native import usage_reader_config
from tests.native.mock_envoy import build_mock, run_mock

HARNESS: Final = Path(__file__).with_name("glue_harness.c")


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("glue") / "harness"
    # usage_filter.c is included whole by the harness, to reach its static functions.
    sources = [name for name in MODULE.sources if name != "usage_filter.c"]
    return build_mock(HARNESS, sources, target)


def run(harness: Path, *arguments: str, stdin: str = "") -> str:
    return run_mock(harness, *arguments, stdin=stdin)


def test_fixed_scenarios(harness: Path) -> None:
    """Held bytes with an empty end frame, empty frames mid-stream, trailers; a chunk of
    100 and of 1000 slices; headers-only answers with the cut armed; refused slices; an
    answer not of the reader's media type; a JSON answer with an out-of-range member."""
    assert run(harness, "cases").strip() == "ok"


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_fuzz_hooks_against_the_scanner_alone(harness: Path, seed: int) -> None:
    assert run(harness, "fuzz", "15000", str(seed)).strip() == "ok 15000"


# RE2's \s is [\t\n\f\r ] (Python's also takes \v); its (?i) here is ASCII's.
JSON_MEDIA: Final = re.compile(wire.JSON_MEDIA_TYPE_REGEX.replace(r"\s", r"[\t\n\f\r ]"), re.ASCII)


def event_stream_media(media: str) -> bool:
    """sse_to_metadata's rule: the type before any `;`, spaces and tabs trimmed."""
    return media.split(";", 1)[0].strip(" \t").lower() == "text/event-stream"


MEDIA_TYPES: Final = [
    "", "application/json", "APPLICATION/JSON", "Application/Json; charset=utf-8",
    "  application/json  ", "\tapplication/json\r\n", "application/json;", "application/json ;x",
    "application/problem+json", "application/vnd.api+json", "application/a.b-c+json",
    "application/+json", "application/json+json", "application/xjson", "application/x-json",
    "application/jsonx", "application/json x", "application/json\x0b", "\x0bapplication/json",
    "application/json\f", "application/js", "application/", "application", "text/json",
    "application/ld+json;profile=x", "application/json\n;a\nb", "application/vnd.a_b+json",
    "application/ json", "application/json\x00", "text/event-stream",
    "TEXT/EVENT-STREAM; charset=utf-8", " \ttext/event-stream \t;x", "text/event-stream\r",
    "text/event-streams", "text/event-stream ,", ";text/event-stream", "text/event",
    "text/plain", "application/json\u00e9", "application/\u017fon",
]  # fmt: skip


def test_media_types_as_the_regex_and_sse_rule(harness: Path) -> None:
    lines = "".join(media.encode("latin-1").hex() + "\n" for media in MEDIA_TYPES[:-1])
    # \u017f (long s) folds to `s` in Unicode only: sent as UTF-8 bytes.
    lines += MEDIA_TYPES[-1].encode().hex() + "\n"
    answers = run(harness, "media", stdin=lines).splitlines()
    assert len(answers) == len(MEDIA_TYPES)
    for media, answer in zip(MEDIA_TYPES, answers, strict=True):
        expected = (JSON_MEDIA.fullmatch(media) is not None, event_stream_media(media))
        assert tuple(bool(int(bit)) for bit in answer.split()) == expected, repr(media)


GOOD_CONFIG: Final = (
    "usage_header=x-sluicegate-usage\nby_log=log\nby_stream=stream\nby_chunks=chunks\n"
    "by_nobody=observer,none\n"
    "namespace=sluicegate\ninjected=injected\ninjected_value=true\n"
    "usage_namespace=sluicegate.usage\ncount_key=content_events\n"
    "members=prompt_tokens,completion_tokens\n"
)


@pytest.mark.parametrize(
    ("config", "made"),
    [
        (GOOD_CONFIG, True),
        (GOOD_CONFIG.replace("\n", "\r\n"), True),
        ("\n\n" + GOOD_CONFIG.replace("\n", "\n\n"), True),
        (GOOD_CONFIG.rstrip("\n"), True),
        (GOOD_CONFIG.replace("by_log=log\n", ""), False),  # one missing
        (GOOD_CONFIG.replace("by_nobody=observer,none\n", ""), False),
        (GOOD_CONFIG + "by_log=log\n", False),  # repeated
        (GOOD_CONFIG + "other=x\n", False),  # unknown
        (GOOD_CONFIG.replace("by_log=log", "by_log="), False),  # empty
        (GOOD_CONFIG.replace("by_log=log", "by_log"), False),  # no `=`
        (GOOD_CONFIG.replace("by_log=log", "by_log=a=b"), True),  # `=` in a value
        (GOOD_CONFIG.replace("completion_tokens", "prompt_tokens"), False),  # members
        (GOOD_CONFIG.replace("completion_tokens", ""), False),
        (GOOD_CONFIG.replace("completion_tokens", "x" * 40), False),
        (GOOD_CONFIG.replace("completion_tokens", ",".join(f"m{i}" for i in range(8))), False),
        ("", False),
    ],
)  # fmt: skip
def test_configuration_is_checked(harness: Path, config: str, made: bool) -> None:
    assert run(harness, "config", stdin=config.encode().hex() + "\n").split() == [str(int(made))]


def test_the_translators_configuration_is_the_one_the_library_takes(harness: Path) -> None:
    """The names come from wire through xds/translate/native.py: a key the C does not
    know, or one it needs and is not sent, makes every listener with the filter fail."""
    config = usage_reader_config()
    assert run(harness, "config", stdin=config.encode().hex() + "\n").split() == ["1"]
    for line in config.splitlines():  # each one of them needed
        without = config.replace(line + "\n", "")
        assert run(harness, "config", stdin=without.encode().hex() + "\n").split() == ["0"]


def test_the_module_binds_every_symbol_when_loaded(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Built with -z now: Envoy opens a module RTLD_LAZY, so a callback Envoy does not
    export would end Envoy at the first request calling it; bound now, the load fails
    instead. (The scanner alone, built with the same flags, loads under ctypes: the
    scanner tests.)"""
    readelf = shutil.which("readelf")
    if shutil.which("gcc") is None or readelf is None:
        pytest.skip("no gcc or readelf on PATH")
    library = build(MODULE, into=tmp_path_factory.mktemp("module"))
    dynamic = subprocess.run([readelf, "-d", str(library)], capture_output=True, text=True,
                             check=True).stdout  # fmt: skip
    assert "BIND_NOW" in dynamic
