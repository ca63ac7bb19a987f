"""How much of a deployment description npudoctor reads, and where a larger one is refused.

A deployment is a few dozen values (the examples: 13 to 37 YAML nodes, at most 1.2 KB), but
its files may come from anyone on a shared machine, and three things make a small input expensive:

- YAML anchors and aliases share one value between places; whatever walks the data afterwards
  (the report, its server arguments) walks every place, so 2 KB of anchors each listing the one
  before ten times stand for 10**9 values (a "billion laughs").
- Merge keys (``<<: [*a, *a, ...]``) are expanded inside PyYAML's constructor, which before
  PyYAML 6.0.4 (``pyyaml>=6`` admits 6.0 to 6.0.3) copies the merged pairs, duplicates included:
  the same growth before ``safe_load`` even returns.
- PyYAML's parser is pure Python (50 to 120 µs a node, ~2 µs a character of text on a busy
  two-core machine), and it converts base-60 integers (``1:2:3``) in time quadratic in their length.

So a YAML document is measured while PyYAML composes it, before any Python value is built: each
node counts once where it is written and an alias counts the nodes and text of what it stands for
(known once its anchor is composed), so the measure costs the document's length, not its
expansion, and stops at the first node that crosses a limit. A model's ``config.json`` and the
words of a launch command or ``--env`` are bounded as they are read. A refusal is an
``InputError`` (one line, exit 2) naming the file, the key path and the limit; a value is never
echoed (it may be a secret).
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

from npudoctor.errors import InputError, file_kind, short_repr

# A deployment YAML file, in bytes. The examples are at most 1.2 KB, and a real model's
# config.json pasted in as hf_config adds 1.5 KB; 64 KiB is fifty times both, and PyYAML reads
# that much text in ~0.15 s (that much structure stops at MAX_NODES first).
MAX_YAML_BYTES = 64 * 1024
# The YAML nodes of a deployment (mapping keys, values, list items) with its aliases expanded,
# and the words of a launch command. The examples have 13 to 37 nodes, 140 with a real model's
# config.json inline (DeepSeek-V3.2's: 108); 5,000 is over thirty times that, and PyYAML
# composes that many in 0.3 to 0.6 s, the longest a document that crosses the limit is read.
MAX_NODES = 5_000
# The characters of every YAML scalar with the aliases expanded: as much text as a file may hold,
# so an alias cannot make a document larger than a file could be.
MAX_TEXT_CHARS = MAX_YAML_BYTES
# How deep YAML nodes nest (the document's top mapping is level 1): the items of
# roles.decode.server_args.cuda_graph_bs are at level 6, a model config inline goes a level or two
# further; 100 is far beyond both, and below the depth where PyYAML's recursive composer (three
# Python frames a level, with this module's measure) would exhaust Python's stack.
MAX_DEPTH = 100
# One value (a YAML scalar, a launch-command word, an --env assignment). The longest values a
# deployment holds are paths (PATH_MAX is 4096 on Linux) and JSON-valued server arguments
# (--json-model-override-args): a few KB. PyYAML turns a 16 KiB base-60 integer into Python in
# ~0.05 s, a 128 KiB one (the longest word Linux passes in an argv) in 1.6 s.
MAX_VALUE_CHARS = 16 * 1024
# A model's config.json, in bytes. The examples' are 1.2 to 1.4 KB; per-module tables
# (quantization ignore lists, per-layer block configs) make some real ones much larger: 4 MiB
# leaves them room, and the json module reads that in ~0.1 s (a file of nothing but ``{},``
# becomes ~300 MB of Python objects, the worst 4 MiB can do).
MAX_CONFIG_BYTES = 4 * 1024 * 1024

# The sizes a role's server arguments state that size the live depth's work, the most each may be.
# The probes build one process's share on CPU and loop over ranks and pages: a typo of 2147483647
# (which the 32-bit check admits) made ``attn_cp_size`` alone allocate 6 GB. Each limit is far
# beyond a real deployment:
# - ``tp_size``, ``dp_size``: the NPUs of a role, and the largest Ascend system (a CloudMatrix 384
#   super-node) has 384; 1,024 leaves room.
# - ``attn_cp_size``: context-parallel ranks of attention, 2 to 16 in practice (it divides the
#   attention TP size); NPD004's probe runs every CP rank of a batch in one process, its all-gathers
#   growing as the square of the ranks (64 ranks: ~150 MB and 10 s).
# - ``page_size``: tokens a KV page holds; sglang's NPU default is 128, the Ascend attention kernels
#   take blocks up to 512 tokens; 1,024 leaves room. Every probed pool holds a few pages per layer.
# ``pp_size`` needs none: it is at most the model's layers, and NPD003 probes at most
# ``livepools.PROBED_LAYERS`` layers' stages (more stages than that: cannot tell).
MAX_SERVER_SIZES = {"tp_size": 1024, "dp_size": 1024, "attn_cp_size": 64, "page_size": 1024}

# a mapping key shown as written in a key path; any other is shown as its short repr
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_<>-]{1,40}")


def read_bytes(path: Path, limit: int, what: str) -> bytes:
    """The bytes of the regular file ``path``, or ``InputError`` when it holds more than ``limit``
    (read up to ``limit + 1``: a file that grows while it is read is bounded too) or is no regular
    file. It is opened without waiting (``O_NONBLOCK``: a FIFO would wait for a writer for ever) and
    judged by what was opened, not by a look before (which a rename can outdate); an ``OSError``
    (missing, denied, a link loop) is the caller's to word."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    mode = os.fstat(descriptor).st_mode
    if not stat.S_ISREG(mode):
        os.close(descriptor)
        raise InputError(f"{path}: is {file_kind(mode)}, not a regular file: refused, not read as {what}")
    with open(descriptor, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise InputError(f"{path}: larger than {_size(limit)}, the most npudoctor reads of {what}")
    return data


def load_yaml(text: str, where: str) -> Any:
    """``yaml.safe_load(text)`` within the limits above; ``where`` (the file) starts every refusal.
    PyYAML's own errors pass through, for the caller to word."""
    loader = MeasuredLoader(text, where)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def check_words(words: list[str] | tuple[str, ...], where: str) -> None:
    """``InputError`` when a list of command-line words (a launch command, the --env values) is
    longer than a deployment may be, or one word longer than a value may be."""
    if len(words) > MAX_NODES:
        raise InputError(f"{where}: {len(words)} words, more than {MAX_NODES} (the most npudoctor reads)")
    for number, word in enumerate(words, 1):
        if len(word) > MAX_VALUE_CHARS:
            raise InputError(
                f"{where}: word {number} is {len(word)} characters long, longer than {MAX_VALUE_CHARS}"
                " (the longest value npudoctor reads)"
            )


class MeasuredLoader(yaml.SafeLoader):
    """PyYAML's safe loader, measuring the document as it is composed (``compose_node``): ``nodes``
    and ``chars`` so far, each alias counted as what it stands for; ``InputError`` at the node
    that crosses a limit, named by its key path."""

    def __init__(self, text: str, where: str):
        super().__init__(text)
        self.where = where
        self.nodes = 0
        self.chars = 0
        self._expanded: dict[int, tuple[int, int]] = {}  # id(node) -> (nodes, chars) it stands for
        self._path: list[str] = []

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        self._path.append(_step(parent, index))
        try:
            if len(self._path) > MAX_DEPTH:
                raise InputError(
                    f"{self.where}: {self._key_path()}: nests deeper than {MAX_DEPTH} levels"
                    " (the most npudoctor reads)"
                )
            if self.check_event(yaml.AliasEvent):
                node = super().compose_node(parent, index)
                # an alias inside its own anchor (a cycle) counts once here; the loader refuses it
                # with its keys once the data is built
                self._count(*self._expanded.get(id(node), (1, 0)))
                return node
            nodes, chars = self.nodes, self.chars
            node = super().compose_node(parent, index)  # its children count themselves
            text = len(node.value) if isinstance(node, yaml.ScalarNode) else 0
            if text > MAX_VALUE_CHARS:
                raise InputError(
                    f"{self.where}: {self._key_path()}: a value of {text} characters, longer than"
                    f" {MAX_VALUE_CHARS} (the longest npudoctor reads)"
                )
            self._count(1, text)
            self._expanded[id(node)] = (self.nodes - nodes, self.chars - chars)
            return node
        finally:
            self._path.pop()

    def _count(self, nodes: int, chars: int) -> None:
        self.nodes += nodes
        self.chars += chars
        if self.nodes > MAX_NODES:
            raise InputError(
                f"{self.where}: {self._key_path()}: more than {MAX_NODES} values with the document's"
                " aliases expanded (the most npudoctor reads; a deployment has a few dozen)"
            )
        if self.chars > MAX_TEXT_CHARS:
            raise InputError(
                f"{self.where}: {self._key_path()}: more than {MAX_TEXT_CHARS} characters of text with"
                " the document's aliases expanded (the most npudoctor reads)"
            )

    def _key_path(self) -> str:
        return "".join(self._path).removeprefix(".") or "top level"


def _step(parent: yaml.Node | None, index: Any) -> str:
    """The key path's step to the node PyYAML composes next: ``[index]`` in a list, ``.key`` for a
    mapping's value, nothing for the document or a mapping's key (named by its mapping)."""
    if isinstance(index, int):
        return f"[{index}]"
    if isinstance(index, yaml.ScalarNode):
        key = index.value
        return "." + (key if _PLAIN_KEY.fullmatch(key) else short_repr(key, 40))
    if isinstance(index, yaml.Node):
        return ".?"  # a list or mapping as a key (``? [a]: b``)
    return ""


def _size(count: int) -> str:
    for unit, scale in (("MiB", 1024**2), ("KiB", 1024)):
        if count >= scale and count % scale == 0:
            return f"{count // scale} {unit}"
    return f"{count} bytes"
