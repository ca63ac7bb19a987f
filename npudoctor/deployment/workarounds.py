"""A catalog record's workaround, repeated in the form the user gave the deployment.

A record's remedy may name server arguments and environment variables that avoid the defect
(``--page-size 128``). The finding says it with the user's own input, so that it can be pasted:
the launch command after ``--`` rewritten (the flag's value replaced where the command passes it,
else added; the variables as ``NAME=value`` prefixes), or the YAML keys to set for each role the
defect bites, or the flags. Every word is quoted for a shell (``npudoctor.terminal.shell_join``), a
secret of the launch command as a variable reference (``npudoctor.deployment.redact``); the YAML's
path is redacted as any value is. The launch command comes last, after ``COMMAND_LEAD``, so that
the text report can print it whole (``command_of``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from npudoctor.deployment.redact import redact_argv, redact_value
from npudoctor.results import Result
from npudoctor.terminal import shell_join

COMMAND_LEAD = "your launch command with it: "


def command_of(advice: str) -> tuple[str, str]:
    """``advice`` (a remediation's) apart: the text before the workaround's launch command and the
    command (empty when it names none)."""
    text, lead, command = advice.partition(COMMAND_LEAD)
    return (text + lead.rstrip(), command) if command else (advice, "")


def flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


def rewritten_command(argv: Sequence[str], flags: dict, env: dict[str, str]) -> list[str]:
    """``argv`` (a launch command, ``NAME=value`` prefixes allowed) with each of ``flags`` set to
    its value (replaced where given as ``--flag X`` or ``--flag=X``, else appended) and ``env`` as
    prefixes (replacing a prefix of the same name)."""
    words = list(argv)
    start = 0
    while start < len(words) and "=" in words[start] and not words[start].startswith("-"):
        start += 1
    prefixes = [w for w in words[:start] if w.split("=", 1)[0] not in env]
    words = words[start:]
    for name, value in flags.items():
        flag, text = flag_of(name), _text(value)
        if isinstance(value, bool):  # a switch (store_true): present for True, gone for False
            words = [w for w in words if w != flag and not w.startswith(flag + "=")]
            if value:
                words.append(flag)
            continue
        for index, word in enumerate(words):
            if word == flag and index + 1 < len(words):
                words[index + 1] = text
                break
            if word.startswith(flag + "="):
                words[index] = f"{flag}={text}"
                break
        else:
            words += [flag, text]
    return [*prefixes, *(f"{k}={v}" for k, v in env.items()), *words]


def workaround_text(
    flags: dict,
    env: dict[str, str],
    roles: Sequence[str],
    config: str | None = None,
    launch_command: Sequence[str] = (),
) -> str:
    """The workaround in the user's form: their launch command rewritten, the YAML keys per role,
    or the flags and variables."""
    if launch_command:
        return COMMAND_LEAD + shell_join(
            redact_argv(rewritten_command(launch_command, flags, env), for_shell=True)
        )
    if config is not None:
        keys = [f"server_args.{k}: {_text(v)}" for k, v in flags.items()] + [
            f"env.{k}: {v}" for k, v in env.items()
        ]
        where = ", ".join(f"roles.{r}" for r in roles) or "each role"
        return f"in {redact_value(config)}, under {where}: set " + "; ".join(keys)
    words = [
        w
        for k, v in flags.items()
        if v is not False
        for w in ((flag_of(k),) if v is True else (flag_of(k), _text(v)))
    ]
    dropped = [flag_of(k) for k, v in flags.items() if v is False]
    said = []
    if env or words:
        said.append("pass " + shell_join([*(f"{k}={v}" for k, v in env.items()), *words]))
    if dropped:
        said.append("do not pass " + ", ".join(dropped))
    return "; ".join(said)


def with_workaround(result: Result, record, config: str | None, launch_command: Sequence[str]) -> Result:
    """``result`` with the record's workaround in the user's form added to its remediation."""
    remedy = record.remedy
    if result.remediation is None or not (remedy.flags or remedy.env):
        return result
    text = workaround_text(remedy.flags, remedy.env, result.roles, config, launch_command)
    advice = f"{result.remediation.advice}; {text}"
    remediation = dataclasses.replace(result.remediation, advice=advice, workaround=text)
    return dataclasses.replace(result, remediation=remediation)


def _text(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
