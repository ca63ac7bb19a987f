"""Read an sglang launch command line into ServerArgs field names.

``npudoctor check -- python -m sglang.launch_server --model-path M --pp-size 2 ...``
describes a deployment the way it is really started. When sglang itself is importable
its own argparse definitions are used; otherwise a built-in table of the flags the
checks need (with the aliases sglang accepts), and every other ``--flag [value]`` is
kept under its sglang field name, so nothing the user wrote is lost. Whether the release
under test accepts each flag is decided once the target is known (``npudoctor.target.serverargs``).
"""

from __future__ import annotations

import argparse
import enum
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from npudoctor.deployment.limits import check_words
from npudoctor.deployment.redact import redact_argv
from npudoctor.errors import InputError, UnknownLaunchFlag

_ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")

# dest -> (type, aliases). Aliases as sglang's server_args.py spells them.
_KNOWN_FLAGS: dict[str, tuple[Callable[[str], Any] | None, tuple[str, ...]]] = {
    "model_path": (str, ("--model-path", "--model")),
    "tp_size": (int, ("--tp-size", "--tensor-parallel-size", "--tp")),
    "pp_size": (int, ("--pp-size", "--pipeline-parallel-size")),
    "dp_size": (int, ("--dp-size", "--data-parallel-size")),
    "attn_cp_size": (int, ("--attn-cp-size", "--attention-context-parallel-size")),
    "page_size": (int, ("--page-size",)),
    "disaggregation_mode": (str, ("--disaggregation-mode",)),
    "disaggregation_transfer_backend": (str, ("--disaggregation-transfer-backend",)),
    "kv_cache_dtype": (str, ("--kv-cache-dtype",)),
    "attention_backend": (str, ("--attention-backend",)),
    "prefill_attention_backend": (str, ("--prefill-attention-backend",)),
    "decode_attention_backend": (str, ("--decode-attention-backend",)),
    "speculative_algorithm": (str, ("--speculative-algorithm", "--speculative-algo")),
    "speculative_num_steps": (int, ("--speculative-num-steps",)),
    "speculative_num_draft_tokens": (int, ("--speculative-num-draft-tokens",)),
    "device": (str, ("--device",)),
    "enable_prefill_context_parallel": (None, ("--enable-prefill-context-parallel",)),
    "enable_nsa_prefill_context_parallel": (None, ("--enable-nsa-prefill-context-parallel",)),
    "enable_prefill_cp": (None, ("--enable-prefill-cp",)),
    "enable_dp_attention": (None, ("--enable-dp-attention",)),
}
_ALIASES = {alias: dest for dest, (_, aliases) in _KNOWN_FLAGS.items() for alias in aliases}


@dataclass
class LaunchCommand:
    """A parsed launch command: env assignments before it, server args, flags kept verbatim."""

    env: dict[str, str] = field(default_factory=dict)
    server_args: dict[str, Any] = field(default_factory=dict)
    unknown_args: list[str] = field(default_factory=list)
    # the flags for the release under test to accept (``npudoctor.target.serverargs``): every flag with
    # the built-in table; with sglang's own parser, only those it did not know
    flags: list[str] = field(default_factory=list)


def parse_command(argv: list[str], parser: argparse.ArgumentParser | None = None) -> LaunchCommand:
    """Parse ``[env] [VAR=val ...] python -m sglang.launch_server ARGS`` (or ``sglang serve ARGS``).

    A bare argument list (starting with ``--``) is accepted too. ``parser`` is sglang's
    own ServerArgs parser when the caller could import it.
    """
    if not argv:
        raise InputError("empty launch command after '--'")
    check_words(argv, "launch command")
    command = LaunchCommand()
    rest = _strip_env_prefix(list(argv), command.env)
    args = _server_arguments(rest)
    if parser is not None:
        try:
            namespace, unknown = parser.parse_known_args(args)
        except (argparse.ArgumentError, SystemExit) as error:
            raise InputError(f"launch command: {error}") from None
        command.server_args = {key: _plain(value) for key, value in vars(namespace).items()}
        command.unknown_args = list(unknown)
        command.flags = flag_names(unknown)
    else:
        command.server_args, command.unknown_args = parse_arguments(args)
        command.flags = flag_names(args)
    return command


def flag_names(args: list[str]) -> list[str]:
    """The flags of an argument list as written (``--x=1`` -> ``--x``), values left out."""
    return [token.partition("=")[0] for token in args if token.startswith("--") and token != "--"]


def _plain(value: Any) -> Any:
    """A value sglang's parser produced, as the plain data a report holds: what a custom
    argparse type or action returns (an enum, a dtype, ...) is kept as its text."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, enum.Enum):
        return _plain(value.value)
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    return str(value)


def parse_arguments(args: list[str]) -> tuple[dict[str, Any], list[str]]:
    """Server args from sglang CLI flags with the built-in table; other flags kept by field name."""
    server_args: dict[str, Any] = {}
    unknown: list[str] = []
    i = 0
    while i < len(args):
        token = args[i]
        if not token.startswith("--") or token == "--":
            raise UnknownLaunchFlag(
                f"launch command: unexpected argument {redact_argv([token])[0]!r} (flags start with --)",
                token,
            )
        flag, has_inline, inline = token.partition("=")
        values: list[str] = [inline] if has_inline else []
        i += 1
        if not has_inline:
            while i < len(args) and not args[i].startswith("--"):
                values.append(args[i])
                i += 1
        dest = _ALIASES.get(flag)
        if dest is None:  # kept under its sglang field name; a bare flag is a switch
            unknown.append(token if has_inline or not values else " ".join([token, *values]))
            server_args[flag[2:].replace("-", "_")] = (
                (values if len(values) > 1 else values[0]) if values else True
            )
        else:
            server_args[dest] = _convert(flag, values, _KNOWN_FLAGS[dest][0])
    return server_args, unknown


def sglang_parser() -> argparse.ArgumentParser | None:
    """sglang's own launch_server parser, with defaults suppressed, if sglang imports here."""
    try:
        from sglang.srt.server_args import ServerArgs  # type: ignore[import-not-found]

        parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
        ServerArgs.add_cli_args(parser)
    except Exception:  # sglang absent or not importable on this host: use the built-in table
        return None
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    return parser


def _convert(flag: str, values: list[str], kind: Callable[[str], Any] | None) -> Any:
    if kind is None:  # a store_true switch
        if values:
            raise InputError(f"launch command: {flag} takes no value, got {' '.join(redact_argv(values))!r}")
        return True
    if len(values) != 1:
        raise InputError(f"launch command: {flag} expects one value, got {len(values)}")
    try:
        return kind(values[0])
    except ValueError:
        raise InputError(
            f"launch command: {flag} expects {kind.__name__}, got {redact_argv(values)[0]!r}"
        ) from None


def _strip_env_prefix(argv: list[str], env: dict[str, str]) -> list[str]:
    if argv and os.path.basename(argv[0]) == "env":
        argv = argv[1:]
    while argv and _ENV_ASSIGNMENT.match(argv[0]):
        name, _, value = argv.pop(0).partition("=")
        env[name] = value
    return argv


def _server_arguments(argv: list[str]) -> list[str]:
    """The flags after the launcher: ``python [opts] -m sglang.launch_server`` or ``sglang serve``."""
    if not argv:
        raise InputError("launch command: no program after the environment assignments")
    if argv[0].startswith("--"):
        return argv
    program = os.path.basename(argv[0])
    if _PYTHON.match(program):
        if "-m" in argv:
            index = argv.index("-m")
            module = argv[index + 1] if index + 1 < len(argv) else ""
            if module in ("sglang.launch_server", "sglang.srt.server"):
                return argv[index + 2 :]
            raise InputError(f"launch command: runs module {module!r}, not sglang.launch_server")
        raise InputError("launch command: python without '-m sglang.launch_server'")
    if program == "sglang" and len(argv) > 1 and argv[1] in ("serve", "launch_server"):
        return argv[2:]
    raise InputError(
        f"launch command: cannot read {' '.join(redact_argv(argv[:3]))!r}; expected "
        "'python -m sglang.launch_server ...', 'sglang serve ...' or the bare --flags"
    )
