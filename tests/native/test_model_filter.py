"""The native model reader's glue to Envoy (sluicegate/native/c/model_filter.c, with
model_walk.c), against a mock of Envoy's side of the ABI (model_harness.c, which calls the
filter's kind directly), built with gcc here, with AddressSanitizer and UBSan when gcc has
them.

The harness drives the hooks as Envoy 1.40 does: request headers from a multimap (repeated
values, empty ones), then the body in frames of slices (empty ones too), what a hook
holds with StopIterationAndBuffer buffered for the next, the data that ends the stream
moved into the buffered body first (DynamicModuleHttpFilter::decodeData), and the stream
ended with its last data, by an empty frame or by trailers. It records what the filter
wrote (metadata, headers, the body it spliced, the route cache cleared). The
configuration is the translator's (model_reader_config of FACTS), as Envoy gets it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import pytest

from sluicegate.native import MODULE
from sluicegate.xds.translate.model_reader import ReaderFacts, TenantFacts
from sluicegate.xds.translate.native import model_reader_config
from tests.native.mock_envoy import build_mock, run_mock

HARNESS: Final = Path(__file__).with_name("model_harness.c")
# The model reader alone: the harness calls its kind, so module.c (which names the usage
# reader too) is not linked.
SOURCES: Final = ("model_filter.c", "model_walk.c")
FUZZ_REQUESTS: Final = 2500

# What the harness's scenarios and fuzz assume (model_harness.c names these tenants,
# classes and models): a tenant of every model, an auto one with a held model, one
# limited to a model; two models whose routes ask a stream's usage.
FACTS: Final = ReaderFacts(
    default_max_tokens=256,
    max_output_tokens=4096,
    tenants={
        "acme": TenantFacts("standard", None),
        "beta": TenantFacts(
            "interactive", frozenset({"gpt-4o", "held-model", "org/m1"}), auto=True
        ),
        "gamma": TenantFacts("batch", frozenset({"gpt-4o-mini"})),
    },
    estimates=True,
    asks_usage=frozenset({"gpt-4o", "org/m1"}),
    classes=("interactive", "standard", "batch"),
    held=frozenset({"held-model"}),
    scenarios=True,
)
CONFIG: Final = model_reader_config(FACTS)
# The lines that may repeat: each one is a fact (a class, a model, a tenant), not a setting.
REPEATED: Final = ("class=", "asks_usage=", "held=", "tenant=")


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Path:
    assert set(SOURCES) <= set(MODULE.sources)  # the files the library is built from
    target = tmp_path_factory.mktemp("model") / "harness"
    return build_mock(HARNESS, SOURCES, target)


def run(harness: Path, *arguments: str, stdin: str = "") -> str:
    return run_mock(harness, *arguments, stdin=stdin)


def hexed(*configs: str) -> str:
    """Configurations as the harness reads them: hex, one a line (they hold newlines and
    tabs)."""
    return "".join(config.encode().hex() + "\n" for config in configs)


def made(harness: Path, *configs: str) -> list[bool]:
    """Whether the filter takes each configuration (config_new gives one)."""
    return [answer == "1" for answer in run(harness, "config", stdin=hexed(*configs)).split()]


def test_fixed_scenarios(harness: Path) -> None:
    """A fast-lane tenant's chat; a stream whose usage is asked, its body spliced, in one
    slice, in 1-byte slices over many hooks, ended by its data, an empty frame or
    trailers; an exact-lane client; no body; unknown clients; refused bodies, models and
    classes; an auto tenant's held model; scenarios; configurations refused."""
    assert run(harness, "cases", stdin=hexed(CONFIG)).strip() == "ok"


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_fuzz_requests_against_the_same_sent_whole(harness: Path, seed: int) -> None:
    """Mutated and random bodies (deep nesting, long strings, random bytes) and headers,
    sliced at random: no crash, no sanitizer's report, no leak, the invariants held, and
    what the filter did the same as for the request sent in one piece."""
    answer = run(harness, "fuzz", str(FUZZ_REQUESTS), str(seed), stdin=hexed(CONFIG))
    assert answer.strip() == f"ok {FUZZ_REQUESTS}"


@pytest.mark.parametrize(
    ("config", "taken"),
    [
        (CONFIG, True),
        (CONFIG.replace("\n", "\r\n"), True),
        ("\n\n" + CONFIG.replace("\n", "\n\n"), True),
        (CONFIG.rstrip("\n"), True),
        (CONFIG.replace("namespace=sluicegate\n", ""), False),  # one missing
        (CONFIG + "namespace=sluicegate\n", False),  # repeated
        (CONFIG + "other=x\n", False),  # unknown
        (CONFIG.replace("namespace=sluicegate", "namespace="), False),  # empty
        (CONFIG.replace("namespace=sluicegate", "namespace"), False),  # no `=`
        (CONFIG.replace("max_n=128", "max_n=-1"), False),  # numbers
        (CONFIG.replace("max_n=128", "max_n=1x"), False),
        (CONFIG.replace("max_n=128", "max_n=" + "9" * 16), False),
        (CONFIG.replace("members=model,", "members="), False),  # `model` read
        (CONFIG.replace("caps=max_completion_tokens", "caps=bogus"), False),  # not a member
        (CONFIG + "tenant=zeta\tstandard\n", False),  # too few fields
        (CONFIG + "tenant=zeta\tgold\t0\tall\n", False),  # not a class
        (CONFIG + "tenant=zeta\tstandard\t1\tonly\t\tm\n", False),  # an empty field
        (CONFIG + "tenant=zeta\tstandard\tyes\tall\n", False),  # auto is 0 or 1
        (CONFIG + "tenant=zeta\tstandard\t0\t*\n", False),  # neither all nor only
        (CONFIG + "tenant=zeta\tstandard\t0\n", False),  # no fourth field
        (CONFIG + "tenant=zeta\tstandard\t0\tonly\n", True),  # it may use no model
        (CONFIG.replace("class=batch\n", ""), False),  # gamma's class
        ("".join(line + "\n" for line in CONFIG.splitlines() if not line.startswith("class=")),
         False),  # tenants and no classes
        ("", False),
    ],
)  # fmt: skip
def test_configuration_is_checked(harness: Path, config: str, taken: bool) -> None:
    assert made(harness, config) == [taken]


def test_the_translators_configuration_is_the_one_the_library_takes(harness: Path) -> None:
    """The names come from wire through xds/translate/native.py: a key the C does not
    know, or one it needs and is not sent, makes every listener with the filter fail.
    The lines that may repeat (classes, models, tenants) are the facts', not needed
    each."""
    lines = CONFIG.splitlines()
    settings = [line for line in lines if not line.startswith(REPEATED)]
    assert len(settings) == len({line.split("=", 1)[0] for line in settings})
    withouts = ["".join(other + "\n" for other in lines if other != line) for line in settings]
    assert made(harness, CONFIG, *withouts) == [True] + [False] * len(withouts)
