"""The server arguments a release accepts, read from its source; the deployment checked against them.

sglang refuses to start on an argument it does not know: ``ServerArgs(**fields)`` raises
``TypeError`` on a field it does not define, and its launch parser (``argparse``, prefix
abbreviations allowed) exits on a flag it does not know. A deployment's unknown name must not be
kept silently while the checks run with the default (``tp: 16`` would leave tp_size 1). This module
reads, statically (``ast``, never importing sglang), what the release under test accepts:

* the ``ServerArgs`` fields (annotated names of its class body; from 0.5.20 on also the
  namespace classes ``collect_input_fields`` assembles it from, ``arg_groups/fields/*.py``);
* its command-line flags: every ``parser.add_argument("--x", "--alias", dest=..., action=...)``
  of ``ServerArgs.add_cli_args`` (dest: the keyword, else the first long flag with ``-`` -> ``_``;
  ``BooleanOptionalAction`` adds ``--no-x``) and, from 0.5.14 on, the flags
  ``add_cli_args_from_dataclass`` derives from the ``A[T, Arg(...)]`` annotations (``--field-name``
  or ``Arg(cli_name=...)``, plus ``Arg(aliases=[...])``, none for ``Arg(no_cli=True)``). A
  deprecated flag whose action only warns is accepted; one whose action's ``__call__`` always
  raises (``DeprecatedAction`` in 0.5.3/0.5.4: ``raise ValueError(self.help)``) is retired.

``validate_arguments`` turns a name that no release 0.4.10..0.5.23 knows
(``npudoctor/data/server_args.json``, written by ``scripts/server_args_history.py``) into an input
error with a did-you-mean; a name that another release knows but this one lacks is NPD000's
finding (``checks/npd000_server_arguments``).
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from npudoctor.deployment.redact import redact_value
from npudoctor.errors import InputError, UnknownLaunchFlag, did_you_mean
from npudoctor.results import Location
from npudoctor.static.source import ClassInfo, SourceTree, body_without_docstring, flatten_conditional
from npudoctor.target import resultcache

if TYPE_CHECKING:
    from npudoctor.deployment.facts import Facts, GivenArgument
    from npudoctor.target.discovery import Target

SERVER_ARGS_MODULE = "srt/server_args.py"
_MEMO_KEY = "serverargs.table"
_ANNOTATED = {"A", "Annotated", "typing.Annotated"}
_BOOLEAN_OPTIONAL = {"BooleanOptionalAction", "argparse.BooleanOptionalAction"}
# argparse adds these to every parser it builds (sglang's prepare_server_args keeps add_help).
_ARGPARSE_FLAGS = {"--help": "help"}


@dataclass(frozen=True)
class FlagInfo:
    """One option string of the release's launch parser."""

    dest: str
    line: int
    path: str
    retired: str | None = None  # why sglang refuses it although it parses it (an action that raises)
    sets_field: str | None = None  # the ServerArgs field it sets, where from_cli_args renames the dest


@dataclass
class ServerArgsTable:
    """What one release accepts: ServerArgs field names and launch flags, and where they are."""

    fields: dict[str, str] = field(default_factory=dict)  # name -> "path:line"
    flags: dict[str, FlagInfo] = field(default_factory=dict)  # option string -> info
    location: Location | None = None  # the ServerArgs class

    def accepts_field(self, name: str) -> bool:
        return name in self.fields

    def match_flag(self, option: str) -> list[str]:
        """The option strings ``option`` selects, as argparse does: itself when exact, else every
        option string it is a prefix of (abbreviations are allowed; more than one is ambiguous)."""
        if option in self.flags:
            return [option]
        if not option.startswith("--") or len(option) < 3:
            return []
        return sorted(o for o in self.flags if o.startswith(option))

    def accepts_flag(self, option: str) -> bool:
        matches = self.match_flag(option)
        return len(matches) == 1 and self.flags[matches[0]].retired is None

    def field_suggestions(self, name: str) -> list[str]:
        """Field names close to ``name``: the dest of the flag ``--name`` would select (sglang's
        aliases and abbreviations: ``tp`` -> ``--tp-size`` -> tp_size), else similar spellings."""
        option = "--" + name.replace("_", "-")
        dests = [self.flags[o].sets_field or self.flags[o].dest for o in self.match_flag(option)]
        found = list(dict.fromkeys(d for d in dests if d in self.fields))
        return found[:3] or difflib.get_close_matches(name, list(self.fields), n=1, cutoff=0.6)

    def flag_suggestions(self, option: str) -> list[str]:
        accepted = [o for o, info in self.flags.items() if info.retired is None]
        return difflib.get_close_matches(option, accepted, n=1, cutoff=0.6)


def read_table(tree: SourceTree) -> ServerArgsTable | None:
    """The release's table, read once per tree (``tree.memo``); None when the tree has no
    ``ServerArgs`` class npudoctor can read."""
    if _MEMO_KEY not in tree.memo:
        tree.memo[_MEMO_KEY] = _read(tree)
    return tree.memo[_MEMO_KEY]  # type: ignore[return-value]


def _read(tree: SourceTree) -> ServerArgsTable | None:
    path = tree.package_dir / SERVER_ARGS_MODULE
    if not path.is_file():
        return None
    cls = next((c for c in tree.classes_in(path) if c.name == "ServerArgs"), None)
    if cls is None:
        return None
    table = ServerArgsTable(location=Location(cls.relpath, cls.line, "ServerArgs"))
    declared = _field_declarations(tree, cls)
    for name, (owner, stmt) in declared.items():
        table.fields[name] = f"{owner.relpath}:{stmt.lineno}"
    add_cli_args = cls.methods.get("add_cli_args")
    if add_cli_args is not None:
        _read_add_cli_args(tree, cls, add_cli_args, declared, table)
    if not {"model_path", "tp_size"} <= set(table.fields) or "--model-path" not in table.flags:
        return None  # every release has these: a layout this reader does not know, not a verdict
    renamed = _renamed_dests(cls)
    for option, info in table.flags.items():
        if info.dest in renamed:
            table.flags[option] = dataclasses.replace(info, sets_field=renamed[info.dest])
    for option, dest in _ARGPARSE_FLAGS.items():
        table.flags.setdefault(option, FlagInfo(dest, 0, "argparse"))
    return table


def _renamed_dests(cls: ClassInfo) -> dict[str, str]:
    """``args.tp_size = args.tensor_parallel_size`` in ``from_cli_args`` (up to 0.5.13): the flag's
    dest -> the field it becomes."""
    method = cls.methods.get("from_cli_args")
    renamed: dict[str, str] = {}
    for node in ast.walk(method) if method is not None else ():
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Attribute)
            and isinstance(node.value, ast.Attribute)
            and isinstance(node.targets[0].value, ast.Name)
            and isinstance(node.value.value, ast.Name)
            and node.targets[0].value.id == node.value.value.id
        ):
            renamed[node.value.attr] = node.targets[0].attr
    return renamed


# ----- fields ----------------------------------------------------------------------------------


def _field_declarations(tree: SourceTree, cls: ClassInfo) -> dict[str, tuple[ClassInfo, ast.AnnAssign]]:
    """Every field of ServerArgs: its class body and bases, then the namespace classes the module
    assembles it from (``collect_input_fields([...])``, 0.5.20+)."""
    found: dict[str, tuple[ClassInfo, ast.AnnAssign]] = {}
    sources = list(reversed(tree.mro(cls))) + _namespace_classes(tree, cls)
    for klass in sources:
        for stmt in flatten_conditional(klass.node.body):
            if (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and "ClassVar" not in ast.unparse(stmt.annotation)
            ):
                found.setdefault(stmt.target.id, (klass, stmt))
    return found


def _namespace_classes(tree: SourceTree, cls: ClassInfo) -> list[ClassInfo]:
    if b"collect_input_fields" not in tree.read(cls.path):
        return []  # up to 0.5.19: no namespace classes (and no walk over an 8000-line module)
    module = tree.parse(cls.path)
    if module is None:
        return []
    lists: dict[str, ast.expr] = {}
    for stmt in flatten_conditional(module.body):
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, (ast.List, ast.Tuple)):
            for target in stmt.targets:
                if isinstance(target, ast.Name):
                    lists[target.id] = stmt.value
    classes: list[ClassInfo] = []
    for node in ast.walk(module):
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "collect_input_fields"
            and node.args
        ):
            argument = node.args[0]
            if isinstance(argument, ast.Name):
                argument = lists.get(argument.id, argument)
            if isinstance(argument, (ast.List, ast.Tuple)):
                for element in argument.elts:
                    if isinstance(element, (ast.Name, ast.Attribute)):
                        found = tree.resolve_name(cls.path, ast.unparse(element))
                        if found is not None and found not in classes:
                            classes.append(found)
    return classes


# ----- flags -----------------------------------------------------------------------------------


def _read_add_cli_args(
    tree: SourceTree,
    cls: ClassInfo,
    method: ast.FunctionDef | ast.AsyncFunctionDef,
    declared: dict[str, tuple[ClassInfo, ast.AnnAssign]],
    table: ServerArgsTable,
) -> None:
    for node in ast.walk(method):
        if not isinstance(node, ast.Call):
            continue
        name = ast.unparse(node.func).rpartition(".")[2]
        if name == "add_argument" and isinstance(node.func, ast.Attribute):
            _add_explicit(tree, cls, node, table)
        elif name == "add_cli_args_from_dataclass":
            only = _keyword(node, "fields")
            wanted = _string_list(only) if only is not None else None
            for field_name, (owner, stmt) in declared.items():
                if wanted is None or field_name in wanted:
                    _add_derived(field_name, owner, stmt, table)


def _add_explicit(tree: SourceTree, cls: ClassInfo, call: ast.Call, table: ServerArgsTable) -> None:
    """``parser.add_argument("--x", "--alias", dest=..., action=...)``."""
    options = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    if not options or len(options) != len(call.args):
        return  # computed option strings: none in the releases read so far
    dest_node = _keyword(call, "dest")
    long = [o for o in options if o.startswith("--")]
    if isinstance(dest_node, ast.Constant) and isinstance(dest_node.value, str):
        dest = dest_node.value
    else:
        dest = (long or options)[0].lstrip("-").replace("-", "_")
    action = _keyword(call, "action")
    retired = _retired(tree, cls, action, call) if action is not None else None
    for option in _with_negations(long, action):
        table.flags.setdefault(option, FlagInfo(dest, call.lineno, cls.relpath, retired))


def _add_derived(name: str, owner: ClassInfo, stmt: ast.AnnAssign, table: ServerArgsTable) -> None:
    """The flags ``add_cli_args_from_dataclass`` makes of one ``A[T, "help"]``/``A[T, Arg(...)]`` field."""
    annotation = stmt.annotation
    if not (isinstance(annotation, ast.Subscript) and ast.unparse(annotation.value) in _ANNOTATED):
        return
    extras = annotation.slice.elts[1:] if isinstance(annotation.slice, ast.Tuple) else []
    meta: ast.expr | None = None
    for extra in extras:
        if isinstance(extra, ast.Call) and ast.unparse(extra.func).rpartition(".")[2] == "Arg":
            meta = extra
            break
        if isinstance(extra, (ast.Constant, ast.JoinedStr, ast.BinOp)) and _is_text(extra):
            meta = extra
            break
    if meta is None:
        return  # no Arg and no help text: the dataclass helper skips it
    cli_name, aliases, action = "--" + name.replace("_", "-"), [], None
    if isinstance(meta, ast.Call):
        no_cli = _keyword(meta, "no_cli")
        if isinstance(no_cli, ast.Constant) and no_cli.value is True:
            return
        given = _keyword(meta, "cli_name")
        if isinstance(given, ast.Constant) and isinstance(given.value, str):
            cli_name = given.value
        aliases = _string_list(_keyword(meta, "aliases")) or []
        action = _keyword(meta, "action")
    options = [o for o in [cli_name, *aliases] if o.startswith("--")]
    for option in _with_negations(options, action):
        table.flags.setdefault(option, FlagInfo(name, stmt.lineno, owner.relpath))


def _with_negations(options: list[str], action: ast.expr | None) -> list[str]:
    """``argparse.BooleanOptionalAction`` also registers ``--no-<flag>`` for each long flag."""
    if action is not None and ast.unparse(action) in _BOOLEAN_OPTIONAL:
        return [*options, *("--no-" + o[2:] for o in options)]
    return options


def _retired(tree: SourceTree, cls: ClassInfo, action: ast.expr, call: ast.Call) -> str | None:
    """Why a flag whose action always raises is refused (``raise ValueError(self.help)``), else None."""
    if not isinstance(action, (ast.Name, ast.Attribute)):
        return None
    klass = tree.resolve_class(cls.path, ast.unparse(action))
    if klass is None:
        return None
    method = next((c.methods["__call__"] for c in tree.mro(klass) if "__call__" in c.methods), None)
    if method is None:
        return None
    for stmt in body_without_docstring(method):
        raises = isinstance(stmt, ast.Raise) or (
            isinstance(stmt, ast.Expr)
            and isinstance(stmt.value, ast.Call)
            and ast.unparse(stmt.value.func).endswith("parser.error")
        )
        if raises:
            help_node = _keyword(call, "help")
            text = help_node.value if isinstance(help_node, ast.Constant) else ""
            text = " ".join(str(text).split())[:160]
            reason = f"its action {klass.name} raises when it is given ({klass.relpath}:{stmt.lineno})"
            return f"{reason}: {text}" if text else reason
    return None


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _string_list(node: ast.expr | None) -> list[str] | None:
    if isinstance(node, (ast.List, ast.Tuple)):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return None


def _is_text(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):  # "..." + "..."
        return _is_text(node.left) or _is_text(node.right)
    return False


# ----- the history of every release ------------------------------------------------------------

HISTORY_FILE = "server_args.json"


@dataclass(frozen=True)
class History:
    """For every field name and flag of sglang 0.4.10..0.5.23, the first and last release with it."""

    releases: tuple[str, ...]
    fields: dict[str, tuple[str, str]]
    flags: dict[str, tuple[str, str]]

    @property
    def span(self) -> str:
        return f"{self.releases[0]}..{self.releases[-1]}" if self.releases else "none"

    def known(self, kind: str, name: str) -> tuple[str, str] | None:
        return (self.fields if kind == "field" else self.flags).get(name)


@functools.lru_cache(maxsize=1)
def history() -> History:
    """The bundled history (``npudoctor/data/server_args.json``)."""
    text = resources.files("npudoctor").joinpath("data").joinpath(HISTORY_FILE).read_text(encoding="utf-8")
    data = json.loads(text)
    return History(
        releases=tuple(data["releases"]),
        fields={k: (v[0], v[1]) for k, v in data["fields"].items()},
        flags={k: (v[0], v[1]) for k, v in data["flags"].items()},
    )


def history_document(tables: dict[str, ServerArgsTable]) -> dict:
    """The history file's content from the tables of releases, oldest first (the script's output)."""
    fields: dict[str, list[str]] = {}
    flags: dict[str, list[str]] = {}
    for version, table in tables.items():
        for name in table.fields:
            fields.setdefault(name, [version, version])[1] = version
        for option, info in table.flags.items():
            if info.retired is None:
                flags.setdefault(option, [version, version])[1] = version
    return {
        "about": (
            "Every ServerArgs field and launch flag of the sglang releases below, with the first and "
            "last release that accepts it (read statically by npudoctor.target.serverargs). Regenerate with "
            "`python scripts/server_args_history.py` (see its docstring)."
        ),
        "releases": list(tables),
        "fields": dict(sorted(fields.items())),
        "flags": dict(sorted(flags.items())),
    }


# ----- the deployment against the release --------------------------------------------------------


@dataclass(frozen=True)
class Unaccepted:
    """A name the deployment passes that the release does not accept."""

    given: GivenArgument
    known_in: tuple[str, str] | None  # first and last release that knows it, if any
    retired: str | None = None  # the release parses it but refuses it (why)
    ambiguous: tuple[str, ...] = ()  # the release's flags it abbreviates, when more than one

    @property
    def label(self) -> str:
        return self.given.name if self.given.kind == "flag" else f"ServerArgs field {self.given.name}"


def unaccepted(facts: Facts, table: ServerArgsTable) -> list[Unaccepted]:
    """Every name of the deployment the release does not accept, in the order given."""
    found: list[Unaccepted] = []
    known = history()
    for role in facts.roles:
        for given in role.given:
            if given.kind == "field":
                if table.accepts_field(given.name):
                    continue
                found.append(Unaccepted(given, known.known("field", given.name)))
                continue
            matches = table.match_flag(given.name)
            if len(matches) == 1:
                retired = table.flags[matches[0]].retired
                if retired is None:
                    continue
                found.append(Unaccepted(given, known.known("flag", given.name), retired=retired))
            else:
                found.append(Unaccepted(given, known.known("flag", given.name), ambiguous=tuple(matches)))
    return found


def validate_arguments(facts: Facts, target: Target) -> None:
    """Raise ``InputError`` (exit 2) for the first name of the deployment that no release knows,
    naming where it came from, with a did-you-mean from this release's names. Names another
    release knows are left to NPD000 (a finding: the server would refuse to start)."""
    if not facts.roles:
        return
    table = resultcache.remembered("server-args table", target.cache_key, lambda: read_table(target.tree))
    if table is None:
        return  # no ServerArgs npudoctor can read: NPD000 says so
    release = f"sglang {target.version}" if target.version else "this sglang"
    span = history().span
    for item in unaccepted(facts, table):
        if item.known_in is not None or item.retired is not None:
            continue
        given = item.given
        if given.kind == "field":
            hint = did_you_mean(table.field_suggestions(given.name), quote=True)
            raise InputError(
                f"{given.where}: unknown server argument {redact_value(given.name)!r} ({release} has no "
                f"ServerArgs field of that name, nor did any release {span}){hint}"
            )
        if item.ambiguous:
            raise InputError(
                f"{given.where}: ambiguous flag {_shown(given.name)} ({release} would read it as any of "
                f"{', '.join(item.ambiguous)} and refuses it)"
            )
        hint = did_you_mean(table.flag_suggestions(given.name))
        raise UnknownLaunchFlag(
            f"{given.where}: unknown flag {_shown(given.name)} ({release} has no such flag, nor did any "
            f"release {span}){hint}",
            given.name,
        )


def _shown(flag: str) -> str:
    """A flag as the user wrote it, for one error line: secrets redacted, controls escaped."""
    text = redact_value(flag)
    return text if text.isprintable() else repr(text)


def history_path() -> Path:
    """Where the bundled history lives in this checkout (the script writes it)."""
    return Path(__file__).resolve().parent.parent / "data" / HISTORY_FILE
