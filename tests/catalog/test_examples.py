"""No record fires on an example deployment where the wheels say it does not ship, and none is
silent where they say it does: every example x release, each record's verdict is ``fail`` exactly
when the deployment meets its predicate and the release is in its derived ``affected`` range."""

from __future__ import annotations

import pytest

from npudoctor.deployment.load import from_yaml
from npudoctor.engine.catalog import all_records
from npudoctor.results import Status
from npudoctor.target.discovery import discover

from support.repo import EXAMPLES

DEPLOYMENTS = sorted(EXAMPLES.glob("*.yaml"))
QUICK = ["0.5.16", "0.5.23"]
SLOW = ["0.5.8", "0.5.10.post1", "0.5.12", "0.5.13.post1", "0.5.14", "0.5.18", "0.5.20", "0.5.22"]


def sweep(version: str, release) -> None:
    target = discover(release(version) / "sglang")
    for path in DEPLOYMENTS:
        facts = from_yaml(path, shell={}).facts
        for record in all_records():
            result = record.run(target, facts, "static")
            bites = bool(record.biting_roles(facts))
            ships = version in record.releases["affected"]
            expected = Status.FAIL if bites and ships else (Status.PASS if bites else Status.SKIP)
            assert result.status is expected, (path.name, version, record.id, result.summary)
    target.release()


@pytest.mark.parametrize("version", QUICK)
def test_records_on_the_examples_follow_the_derived_ranges(version, release):
    sweep(version, release)


@pytest.mark.slow
@pytest.mark.parametrize("version", SLOW)
def test_records_on_the_examples_follow_the_derived_ranges_on_more_releases(version, release):
    sweep(version, release)
