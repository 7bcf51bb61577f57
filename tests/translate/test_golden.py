"""Golden files: every config in testdata/in/, translated, equals testdata/out/<case>/, and
every config in testdata/invalid/ gets exactly the problems in its `.problems` file.

Layout (after Envoy Gateway's internal/xds/translator/testdata):

    testdata/in/<case>.yaml            an ordinary sluicegate config, one feature per case
    testdata/in/keys/                  fake keys that `api_key: {file: ...}` sources name
                                       (`env:` sources get fake ones: cases.fake_environment)
    testdata/out/<case>/<type>.yaml    the translated resources of one xDS type: clusters,
                                       endpoints, listeners, routes or secrets (MessageToDict
                                       with proto field names, keys sorted)
    testdata/invalid/<case>.yaml       a config that `sluicegate validate` rejects
    testdata/invalid/<case>.problems   the lines it prints for it (str(Problem): errors and
                                       warnings), file names relative to testdata/

To add a case, write its input file; then, and after any intended change, regenerate
every output and expected-problems file and review the diff:

    SLUICEGATE_UPDATE_GOLDENS=1 pytest tests/translate/test_golden.py -m "not e2e"

The `e2e` tests feed each case's resources to `envoy --mode validate` (Envoy 1.40), so
every output file is also known to be accepted by the real proxy.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest
import yaml

from sluicegate.config import Problem, validate_file
from sluicegate.xds.translate import (
    CLUSTER,
    ENDPOINT,
    EXTENSION_CONFIG,
    LISTENER,
    ROUTE,
    SECRET,
)

from .cases import TESTDATA, case_names, case_path, for_this_envoy, model_of, translate_case
from .envoy_harness import ads_bootstrap, static_bootstrap, to_dict, validate

OUT = TESTDATA / "out"
INVALID = TESTDATA / "invalid"
UPDATE = os.environ.get("SLUICEGATE_UPDATE_GOLDENS") == "1"
REGENERATE = "if intended, regenerate with SLUICEGATE_UPDATE_GOLDENS=1 and review the diff"
FILES = {
    CLUSTER: "clusters",
    ENDPOINT: "endpoints",
    EXTENSION_CONFIG: "extension_configs",
    LISTENER: "listeners",
    ROUTE: "routes",
    SECRET: "secrets",
}
REPO = Path(__file__).parents[2]


def invalid_names() -> list[str]:
    return sorted(path.stem for path in INVALID.glob("*.yaml"))


def render(case: str) -> dict[str, str]:
    """Output file name -> its text, for every xDS type (an empty type is `[]`)."""
    return {
        f"{FILES[type_url]}.yaml": yaml.safe_dump(
            [to_dict(message) for message in messages], sort_keys=True, width=100
        )
        for type_url, messages in translate_case(case_path(case)).items()
    }


def problems_of(case: str, monkeypatch: pytest.MonkeyPatch) -> list[Problem]:
    """What `sluicegate validate invalid/<case>.yaml` reports, run inside testdata/."""
    monkeypatch.chdir(TESTDATA)
    return validate_file(Path("invalid") / f"{case}.yaml", check_secrets=False)


def check_text(case: str, path: Path, actual: str, what: str) -> None:
    """Write `actual` to `path` when regenerating; else fail, naming case and file, unless
    the file holds exactly `actual`."""
    shown = path.relative_to(REPO)
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(actual, encoding="utf-8")
        return
    if not path.is_file():
        pytest.fail(f"case {case!r}: {shown} is missing; {REGENERATE}", pytrace=False)
    expected = path.read_text(encoding="utf-8")
    if actual != expected:
        diff = difflib.unified_diff(
            expected.splitlines(keepends=True),
            actual.splitlines(keepends=True),
            f"{shown} (expected)",
            f"{what} (actual)",
        )
        pytest.fail(
            f"case {case!r}: {shown} differs from {what}; {REGENERATE}\n{''.join(diff)}",
            pytrace=False,
        )


@pytest.mark.parametrize("case", case_names())
def test_translation_matches_the_output_files(case: str) -> None:
    rendered = render(case)
    folder = OUT / case
    for name, text in rendered.items():
        check_text(case, folder / name, text, "the translation")
    stale = sorted(p.name for p in folder.iterdir() if p.name not in rendered)
    if stale and UPDATE:
        for name in stale:
            (folder / name).unlink()
    elif stale:
        pytest.fail(f"case {case!r}: {folder.relative_to(REPO)} has stray {stale}", pytrace=False)


@pytest.mark.parametrize("case", invalid_names())
def test_invalid_config_gets_exactly_the_expected_problems(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    problems = problems_of(case, monkeypatch)
    lines = "".join(f"{problem}\n" for problem in problems)
    # A file here that validates (or only warns) would test nothing about rejection.
    assert any(p.is_error for p in problems), f"case {case!r}: invalid/{case}.yaml has no errors"
    check_text(case, INVALID / f"{case}.problems", lines, "what `sluicegate validate` prints")


def test_every_expected_file_has_its_input() -> None:
    """An output folder or problems file whose input was renamed or removed tests nothing."""
    orphans = [p for p in OUT.iterdir() if not case_path(p.name).is_file()]
    orphans += [p for p in INVALID.glob("*.problems") if not p.with_suffix(".yaml").is_file()]
    assert not orphans, f"no input for {sorted(str(p.relative_to(REPO)) for p in orphans)}"


@pytest.mark.parametrize("case", case_names())
def test_translation_is_deterministic(case: str) -> None:
    """Same input, byte-identical deterministic serialization (content hashes rely on it)."""
    first, second = translate_case(case_path(case)), translate_case(case_path(case))
    for type_url in first:
        assert [m.SerializeToString(deterministic=True) for m in first[type_url]] == [
            m.SerializeToString(deterministic=True) for m in second[type_url]
        ], f"case {case!r}: {FILES[type_url]} differ between two translations"


@pytest.mark.e2e
@pytest.mark.parametrize("case", case_names())
def test_envoy_accepts_inlined_resources(case: str, tmp_path: Path) -> None:
    """Every generated Listener, RouteConfiguration, Cluster, ClusterLoadAssignment, Secret."""
    resources = for_this_envoy(translate_case(case_path(case)), model_of(case))
    bootstrap = static_bootstrap(resources, ext_proc_port=1)
    result = validate(bootstrap, tmp_path)
    assert result.returncode == 0, f"case {case!r}:\n{result.stdout}{result.stderr}"


@pytest.mark.e2e
@pytest.mark.parametrize("case", case_names())
def test_envoy_accepts_ads_config_sources(case: str, tmp_path: Path) -> None:
    """Listeners (rds) and clusters (eds_config) exactly as pushed, with an ADS source."""
    resources = for_this_envoy(translate_case(case_path(case)), model_of(case))
    result = validate(ads_bootstrap(resources), tmp_path)
    assert result.returncode == 0, f"case {case!r}:\n{result.stdout}{result.stderr}"
