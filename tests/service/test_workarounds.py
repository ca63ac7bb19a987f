"""A catalog workaround repeated with the user's own input: their launch command rewritten, the
YAML keys of the roles it bites, or the flags."""

from __future__ import annotations

import shlex

from npudoctor.deployment.workarounds import rewritten_command, workaround_text

LAUNCH = [
    "ASCEND_USE_FIA=0",
    "python",
    "-m",
    "sglang.launch_server",
    "--model-path",
    "/m",
    "--page-size",
    "16",
]


def test_a_given_flag_gets_the_new_value_in_place():
    assert rewritten_command(LAUNCH, {"page_size": 128}, {}) == [*LAUNCH[:-1], "128"]
    equals = ["python", "-m", "sglang.launch_server", "--page-size=32", "--tp", "4"]
    assert rewritten_command(equals, {"page_size": 128}, {}) == [
        "python",
        "-m",
        "sglang.launch_server",
        "--page-size=128",
        "--tp",
        "4",
    ]


def test_a_missing_flag_is_appended_and_env_replaces_its_prefix():
    words = rewritten_command(LAUNCH, {"chunked_prefill_size": 32768}, {"ASCEND_USE_FIA": "1"})
    assert words[0] == "ASCEND_USE_FIA=1" and "ASCEND_USE_FIA=0" not in words
    assert words[-2:] == ["--chunked-prefill-size", "32768"]


def test_each_input_form_gets_its_own_words():
    launch = workaround_text({"page_size": 128}, {}, ["server"], launch_command=LAUNCH)
    assert shlex.split(launch.split(": ", 1)[1])[-2:] == ["--page-size", "128"]
    yaml_form = workaround_text(
        {"page_size": 128}, {"ASCEND_USE_FIA": "1"}, ["prefill", "decode"], config="d.yaml"
    )
    assert (
        yaml_form
        == "in d.yaml, under roles.prefill, roles.decode: set server_args.page_size: 128; env.ASCEND_USE_FIA: 1"
    )
    assert workaround_text({"page_size": 128}, {}, []) == "pass --page-size 128"


def test_a_secret_in_the_launch_command_stays_redacted():
    text = workaround_text({"page_size": 128}, {}, [], launch_command=[*LAUNCH, "--api-key", "sk-secret"])
    assert "sk-secret" not in text


def test_a_switch_is_added_or_removed_not_given_a_value():
    launch = ["python", "-m", "sglang.launch_server", "--disable-cuda-graph", "--tp", "2"]
    assert rewritten_command(launch, {"disable_cuda_graph": False}, {}) == [
        "python",
        "-m",
        "sglang.launch_server",
        "--tp",
        "2",
    ]
    assert rewritten_command(launch[:3], {"enable_x": True}, {})[-1] == "--enable-x"
    assert workaround_text({"disable_cuda_graph": False}, {}, []) == "do not pass --disable-cuda-graph"
