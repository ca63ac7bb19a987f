"""Usage errors that lead somewhere: a mistyped id, option value or misplaced option is one line
that names the likely intent first (issue 34, item 10), exit 2."""

from __future__ import annotations

import re

import pytest

from npudoctor.engine.registry import all_checks
from npudoctor.formatters import NAMES as FORMAT_NAMES
from npudoctor.patching.fixbase import all_fixes

CHECK_IDS = [c.id for c in all_checks()]


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def suggested(line: str) -> list[str]:
    found = re.search(r"did you mean ([^?]+)\?", line)
    assert found, line
    return found.group(1).split(", ")


@pytest.mark.parametrize(
    "args",
    [("explain", "NPD01"), ("check", "--select", "NPD01"), ("check", "--ignore", "NPD01")],
    ids=["explain", "select", "ignore"],
)
def test_an_unknown_check_id_names_the_close_ones_not_all(cli, release, args):
    """The closest ids first (NPD001 for NPD01), and no listing of every id (66 of them): the
    command that lists them instead."""
    extra = ("--sglang-path", release("0.5.23")) if args[0] == "check" else ()
    code, _, err = cli(*args, *extra)
    line = one_line(err)
    assert code == 2
    assert "unknown check id NPD01; did you mean NPD001" in line
    assert set(suggested(line)) <= set(CHECK_IDS)
    assert sum(i in line for i in CHECK_IDS) <= 3 and line.endswith("(every id: npudoctor list)")


def test_an_unknown_fix_id_names_the_close_ones_and_the_few_known(cli, release):
    code, _, err = cli("fix", "--select", "NPD01", "--sglang-path", release("0.5.23"))
    line = one_line(err)
    assert code == 2
    fixes = [f.id for f in all_fixes()]
    assert suggested(line)[0] == "NPD001" and set(suggested(line)) <= set(fixes)
    assert line.endswith(f"(known: {', '.join(fixes)})")


def test_a_bad_choice_is_one_clean_line_with_the_close_one(cli):
    """Not typer's "Invalid value for '--format' / '-f': Value error, 'sarf' is not one of 'text', ..."."""
    code, _, err = cli("check", "--format", "sarf")
    line = one_line(err)
    assert code == 2
    assert (
        line
        == f"npudoctor: error: --format: 'sarf' is not one of {', '.join(FORMAT_NAMES)}; did you mean sarif?"
    )
    code, _, err = cli("check", "--depth", "statc")
    assert code == 2 and one_line(err).endswith(
        "--depth: 'statc' is not one of static, live, auto; did you mean static?"
    )


@pytest.mark.parametrize(
    ("misplaced", "moved"),
    [(("--format", "json"), "--format json"), (("-q",), "-q"), (("--select=NPD001",), "--select=NPD001")],
)
def test_an_npudoctor_option_after_the_double_dash_says_where_it_goes(cli, release, misplaced, moved):
    """sglang has no such flag; its nearest one (``--load-format`` for ``--format``) would mislead:
    the line says the option is npudoctor's and goes before ``--``."""
    code, _, err = cli(
        "check", "--sglang-path", release("0.5.23"), "--", "python", "-m", "sglang.launch_server", *misplaced
    )
    line = one_line(err)
    assert code == 2
    flag = misplaced[0].partition("=")[0]
    assert f"{flag} is an option of npudoctor check" in line and "go before '--'" in line
    assert f"(move '{moved}' there)" in line and "load-format" not in line


def test_a_mistyped_sglang_flag_still_gets_sglangs_close_flag(cli, release):
    code, _, err = cli(
        "check",
        "--sglang-path",
        release("0.5.23"),
        "--",
        "python",
        "-m",
        "sglang.launch_server",
        "--load-formt",
        "x",
    )
    line = one_line(err)
    assert code == 2 and "unknown flag --load-formt" in line and "did you mean --load-format?" in line
