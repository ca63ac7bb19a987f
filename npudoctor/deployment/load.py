"""Turn the user's description of a deployment into ``Facts``.

Three inputs, one result: a YAML file (``--config``), a real launch command
(``npudoctor check -- python -m sglang.launch_server ...``), or ``--model-path`` with a
few flags. Files are read with PyYAML's safe loader and ``json`` only, within the sizes
``npudoctor.deployment.limits`` sets; nothing in a model directory is ever executed. Every error
names the file and field.

One environment rule for the three: a role's environment is ``shell`` (the caller's variables
that change sglang's code paths, ``shell_env()``; the CLI passes ``{}`` with ``--isolated``),
overridden by what the description sets (YAML ``env:``/role ``env:``, ``--env``, a ``NAME=value``
prefix of the launch command). ``Facts.env_from_shell`` names what came from the shell, so a
report says why ``ASCEND_USE_FIA`` is on. With no description nothing is read: every check assumes
the conditions under which its defect bites.

YAML shape::

    model: {config: path/to/config.json}    # or {path: model_dir} or {hf_config: {...}}
    env: {ASCEND_USE_FIA: "1"}              # shared by all roles
    roles:
      prefill: {server_args: {pp_size: 2, disaggregation_mode: prefill}}
      decode:  {args: ["--disaggregation-mode", "decode"], env: {...}}
    ignore:
      - {id: NPD003, until: 2026-12-31, reason: "PP transfer fixed by our image patch"}
    fail_on: [fail, leak]                   # what counts, as --fail-on (which wins when given)
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from npudoctor.deployment import limits
from npudoctor.deployment.facts import NO_DEPLOYMENT, Facts, GivenArgument, ModelFacts, role_facts
from npudoctor.deployment.ignores import Ignore, parse_yaml
from npudoctor.deployment.launch import flag_names, parse_arguments, parse_command
from npudoctor.deployment.redact import redact_argv
from npudoctor.errors import InputError, path_error, short_repr
from npudoctor.results import Gate

# Environment variables that change sglang's code paths on Ascend; read from the
# caller's environment for every form of deployment (``shell_env``).
_CODE_PATH_ENV_PREFIXES = ("ASCEND_", "SGLANG_", "HCCL_", "PYTORCH_NPU_", "TASK_QUEUE_")

_YAML_KEYS = {"model", "env", "roles", "ignore", "fail_on"}
_ROLE_KEYS = {"server_args", "args", "env"}
_MODEL_KEYS = {"config", "path", "hf_config"}


@dataclass
class Deployment:
    facts: Facts
    ignores: list[Ignore] = field(default_factory=list)
    fail_on: str | None = None  # the YAML's ``fail_on`` words, comma-joined (``results.Gate.parse``)


def shell_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables of ``environ`` (default: this process's) that change sglang's code paths."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items() if k.startswith(_CODE_PATH_ENV_PREFIXES)}


def described(
    *,
    config: Path | None = None,
    launch_command: list[str] | tuple[str, ...] = (),
    model_path: Path | None = None,
    server_flags: Mapping[str, Any] | None = None,
    env_flags: list[str] | tuple[str, ...] = (),
    isolated: bool = False,
    sglang_parser: Callable[[], Any] | None = None,
) -> Deployment:
    """The one deployment the command line describes: ``--config``, a launch command, or
    ``--model-path`` with its flags (``server_flags``: server argument -> value; ``env_flags``:
    ``NAME=VALUE``), or none (every check assumes its worst case). The shell's code-path
    variables are under it unless ``isolated``. ``sglang_parser`` gives the installed release's
    own launch parser for a launch command, where the caller may import sglang."""
    given = [
        name
        for name, present in (
            ("--config", config is not None),
            ("a launch command", bool(launch_command)),
            ("--model-path", model_path is not None),
        )
        if present
    ]
    if len(given) > 1:
        raise InputError(f"give one deployment description, not {' and '.join(given)}")
    if (server_flags or env_flags) and model_path is None:
        raise InputError("--disaggregation-mode/--pp-size/--tp-size/--page-size/--env go with --model-path")
    shell = {} if isolated else shell_env()
    if config is not None:
        return from_yaml(config, shell)
    if launch_command:
        return from_command(list(launch_command), sglang_parser() if sglang_parser else None, shell)
    if model_path is not None:
        return from_flags(model_path, dict(server_flags or {}), _env_pairs(env_flags), shell)
    return no_deployment()


def _env_pairs(pairs) -> dict[str, str]:
    limits.check_words(pairs, "--env")
    env = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise InputError(f"--env {redact_argv([pair])[0]!r}: expected NAME=VALUE")
        env[name] = value
    return _environment(env, "--env")


def _environment(env: dict[str, str], where: str) -> dict[str, str]:
    """``env``, once every name and value is one an environment can carry: a name holds no ``=``
    (the kernel's ``NAME=VALUE`` strings end a name at the first one) and neither holds a NUL
    (which ends a C string). Otherwise the live child, or the command ``run`` starts, fails to
    start with an error that names neither the variable nor the file. A value is never echoed
    (it may be a secret)."""
    for name, value in env.items():
        if "=" in name:
            raise InputError(
                f"{where}: variable name {short_repr(name)} holds '=': an environment variable's "
                "name ends at the first '=' (write NAME: value)"
            )
        if "\0" in name:
            raise InputError(f"{where}: variable name {short_repr(name)} holds a NUL character")
        if "\0" in value:
            raise InputError(
                f"{where}: the value of {name} holds a NUL character, which no environment can carry"
            )
    return env


def from_yaml(path: Path, shell: Mapping[str, str] | None = None) -> Deployment:
    where = str(path)
    data = _load_yaml(path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InputError(f"{where}: top level must be a mapping with model/env/roles")
    _reject_unknown(data, _YAML_KEYS, where)
    base = path.parent
    model = _model_from_yaml(data.get("model"), base, f"{where}: model")
    shared_env = _env_mapping(data.get("env"), f"{where}: env")
    roles_data = data.get("roles")
    if roles_data is None:
        roles_data = {"server": {}}
    if not isinstance(roles_data, dict) or not roles_data:
        raise InputError(f"{where}: roles must be a mapping of role name to {{server_args|args, env}}")
    roles = []
    taken: set[str] = set()  # the shell's variables a role took, not set by the file
    for name, spec in roles_data.items():
        role_where = f"{where}: roles.{name}"
        spec = spec or {}
        if not isinstance(spec, dict):
            raise InputError(f"{role_where}: must be a mapping with server_args, args or env")
        _reject_unknown(spec, _ROLE_KEYS, role_where)
        server_args = spec.get("server_args") or {}
        if not isinstance(server_args, dict):
            raise InputError(f"{role_where}.server_args: must be a mapping of ServerArgs fields")
        unknown: list[str] = []
        given = [GivenArgument("field", str(key), f"{role_where}.server_args") for key in server_args]
        if spec.get("args") is not None:
            args = spec["args"]
            if isinstance(args, str):
                args = args.split()
            if not isinstance(args, list) or not all(isinstance(a, (str, int, float)) for a in args):
                raise InputError(f"{role_where}.args: must be a list of command-line words")
            words = [str(a) for a in args]
            parsed, unknown = _parse_args(words, f"{role_where}.args")
            server_args = {**parsed, **server_args}
            given += [GivenArgument("flag", flag, f"{role_where}.args") for flag in flag_names(words)]
        own = {**shared_env, **_env_mapping(spec.get("env"), f"{role_where}.env")}
        env = {**(shell or {}), **own}
        roles.append(role_facts(str(name), server_args, env, model, tuple(unknown), role_where, tuple(given)))
        taken |= set(shell or {}) - set(own)
    ignores = parse_yaml(data.get("ignore"), where)
    facts = Facts(model=model, roles=tuple(roles), source=f"yaml:{path}", env_from_shell=tuple(sorted(taken)))
    return Deployment(facts, ignores, _fail_on(data.get("fail_on"), f"{where}: fail_on"))


def _fail_on(value: Any, where: str) -> str | None:
    """The YAML's ``fail_on`` (a word or a list of words, as ``--fail-on`` takes them), checked now."""
    if value is None:
        return None
    words = [value] if isinstance(value, str) else value
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
        raise InputError(f"{where}: a word or a list of words ({', '.join(Gate.WORDS)})")
    text = ",".join(words)
    try:
        Gate.parse(text, where)
    except ValueError as error:
        raise InputError(str(error)) from None
    return text


def from_command(argv: list[str], parser=None, shell: Mapping[str, str] | None = None) -> Deployment:
    """A deployment from one real launch command: one role, its env the ``NAME=value`` prefix."""
    command = parse_command(argv, parser)
    env = {**(shell or {}), **_environment(command.env, "launch command")}
    model = None
    # the model is the deployment's model facts, as --config's model: and --model-path give it, not
    # a server argument: the same deployment has the same facts in every form
    server_args = dict(command.server_args)
    model_path = server_args.pop("model_path", None)
    if model_path:
        model = model_from_dir(Path(str(model_path)), "launch command: --model-path")
    mode = str(server_args.get("disaggregation_mode") or "null")
    name = mode if mode in ("prefill", "decode") else "server"
    given = tuple(GivenArgument("flag", flag, "launch command") for flag in command.flags)
    role = role_facts(name, server_args, env, model, tuple(command.unknown_args), "launch command", given)
    return Deployment(
        Facts(model=model, roles=(role,), source="command", env_from_shell=_taken(shell, command.env))
    )


def from_flags(
    model_path: Path | None,
    server_args: dict[str, Any],
    env: dict[str, str],
    shell: Mapping[str, str] | None = None,
) -> Deployment:
    """A deployment from ``--model-path`` and the few server flags ``check`` takes."""
    model = model_from_dir(model_path, "--model-path") if model_path else None
    mode = str(server_args.get("disaggregation_mode") or "null")
    name = mode if mode in ("prefill", "decode") else "server"
    given = tuple(GivenArgument("field", key, "flags") for key in server_args)
    role = role_facts(name, server_args, {**(shell or {}), **env}, model, (), "flags", given)
    return Deployment(Facts(model=model, roles=(role,), source="flags", env_from_shell=_taken(shell, env)))


def _taken(shell: Mapping[str, str] | None, own: Mapping[str, str]) -> tuple[str, ...]:
    """The names of the shell's variables that the description does not set itself."""
    return tuple(sorted(set(shell or {}) - set(own)))


def no_deployment() -> Deployment:
    return Deployment(NO_DEPLOYMENT)


def model_from_dir(path: Path, where: str) -> ModelFacts:
    try:
        mode = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        mode = None
    except (OSError, ValueError) as error:  # a folder the user cannot enter, a name too long, a loop
        raise path_error(f"{where} {path}", error) from None
    if mode is not None and stat.S_ISREG(mode) and path.suffix == ".json":
        return model_from_config_file(path)
    if mode is None or not stat.S_ISDIR(mode):
        raise InputError(
            f"{where} {path}: not a local model directory (npudoctor reads its config.json; "
            "hub ids are not fetched)"
        )
    return model_from_config_file(path / "config.json")


def _read_input(path: Path, limit: int, what: str, missing: str) -> bytes:
    """The bytes of the input file ``path`` (``limits.read_bytes``: a regular file within
    ``limit``); every way it cannot be read is one line naming the path, exit 2."""
    try:
        return limits.read_bytes(path, limit, what)
    except FileNotFoundError:
        raise InputError(f"{path}: {missing}") from None
    except (OSError, ValueError) as error:  # denied, a name too long, a link loop, a NUL
        raise path_error(str(path), error) from None


def model_from_config_file(path: Path) -> ModelFacts:
    raw = _read_input(path, limits.MAX_CONFIG_BYTES, "a model config", "no such model config file")
    try:
        config = json.loads(raw.decode("utf-8-sig"))
    except json.JSONDecodeError as error:
        raise InputError(f"{path}: not valid JSON ({error.msg} at line {error.lineno})") from None
    except UnicodeDecodeError as error:
        raise InputError(f"{path}: cannot read ({error})") from None
    except (ValueError, RecursionError) as error:  # a number too long to convert, nesting too deep
        raise InputError(f"{path}: not a model config npudoctor can read ({_first_line(error)})") from None
    return ModelFacts.from_hf_config(config, str(path))


def _model_from_yaml(spec: Any, base: Path, where: str) -> ModelFacts | None:
    if spec is None:
        return None
    if not isinstance(spec, dict) or len(set(spec) & _MODEL_KEYS) != 1:
        raise InputError(f"{where}: give exactly one of config (config.json), path (model dir) or hf_config")
    _reject_unknown(spec, _MODEL_KEYS, where)
    if "hf_config" in spec:
        return ModelFacts.from_hf_config(spec["hf_config"], f"{where}.hf_config")
    key = "config" if "config" in spec else "path"
    value = spec[key]
    if not isinstance(value, str) or not value:
        raise InputError(f"{where}.{key}: must be a path")
    resolved = (base / value) if not os.path.isabs(value) else Path(value)
    if key == "config":
        return model_from_config_file(resolved)
    return model_from_dir(resolved, f"{where}.path")


def _parse_args(args: list[str], where: str):
    try:
        return parse_arguments(args)
    except InputError as error:
        raise InputError(f"{where}: {str(error).removeprefix('launch command: ')}") from None


def _load_yaml(path: Path) -> Any:
    raw = _read_input(path, limits.MAX_YAML_BYTES, "a deployment file", "no such deployment file")
    try:
        text = raw.decode("utf-8")
        data = limits.load_yaml(text, str(path))  # safe_load, measured before anything is built
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or "malformed YAML"
        raise InputError(f"{path}: invalid YAML{where}: {problem}") from None
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"{path}: cannot read ({error})") from None
    except (ValueError, OverflowError, RecursionError) as error:
        # what safe_load's constructors raise beside YAMLError: a date like 2026-13-45, a number too
        # long to convert, nesting deeper than the parser recurses
        raise InputError(f"{path}: invalid YAML: {_first_line(error)}") from None
    cycle = _cycle(data, (), ())
    if cycle is not None:
        raise InputError(
            f"{path}: invalid YAML: {'.'.join(map(str, cycle))} refers to a mapping or list that"
            " contains it (an alias to its own anchor)"
        )
    return data


def _cycle(value: Any, around: tuple[int, ...], keys: tuple, done: set[int] | None = None) -> tuple | None:
    """The keys to a value that refers back to a mapping or list it sits in, if any. YAML anchors
    and aliases can build such a cycle (``&h {text_config: *h}``), which every reader of the facts
    would follow for ever (a RecursionError deep in a check). A value shared by several aliases is
    walked once (``done``), so a document of nested aliases costs its size, not its expansion."""
    done = set() if done is None else done
    if not isinstance(value, (dict, list)) or id(value) in done:
        return None
    if id(value) in around:
        return keys
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, item in items:
        found = _cycle(item, (*around, id(value)), (*keys, key), done)
        if found is not None:
            return found
    done.add(id(value))
    return None


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:200]}" if text else type(error).__name__


def _env_mapping(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InputError(f"{where}: must be a mapping of NAME: value")
    env = {}
    for key, item in value.items():
        if not isinstance(key, str) or not key:
            raise InputError(f"{where}: variable names must be text, got {key!r}")
        if isinstance(item, (dict, list)):
            raise InputError(f"{where}.{key}: must be a single value")
        env[key] = "" if item is None else (str(item).lower() if isinstance(item, bool) else str(item))
    return _environment(env, where)


def _reject_unknown(data: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = [str(k) for k in data if k not in allowed]
    if unknown:
        raise InputError(
            f"{where}: unknown key(s) {', '.join(sorted(unknown))} (allowed: {', '.join(sorted(allowed))})"
        )
