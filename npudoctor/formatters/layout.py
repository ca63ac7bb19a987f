"""Terminal layout for the human-readable outputs: lines that fit the console width (80 columns
in a pipe or CI log) without ever splitting a word, so a path, a URL or a command line stays
whole and can be copied or grepped.

- ``Para``: word-wrapped text after an optional lead (``"expected: "``), continuation lines
  aligned under the text; a word longer than the line is kept whole on a line of its own.
- ``Whole``: one line, never wrapped: a command, or a path that must stay on its line.
- ``Labelled``: ``label value`` on one line if it fits, else the label and then the value whole
  on a line of its own.
- ``Rows``: one line per item, fixed columns and then a tail that is ellipsized (``wrap=False``)
  or wrapped under its column (``wrap=True``).
- ``Gist``: one line: a part kept whole (a ``path:line``) and then the rest, ellipsized to the width.

No line ends in blanks and none is blanks only: a copied line, a diff of two logs and a grep see
the text alone.

A line longer than the console (a path wider than the terminal) must not be cut at the width
when printed: print these with ``console.print(..., crop=False)`` (``print_whole``), or wrap the
top-level renderable in ``Uncropped``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.segment import Segment
from rich.text import Text

from npudoctor.terminal import printable

ELLIPSIS = "..."
MIN_TEXT_WIDTH = 20  # below this, wrapping stops following the width


def _text(value: str | Text, style: str = "") -> Text:
    """``value`` as ``Text``; a string's control characters escaped first (``printable``: ``Text``
    would drop a CR silently, and the console escapes the others later anyway)."""
    return value.copy() if isinstance(value, Text) else Text(printable(value), style=style)


def _line(*parts: str | Text) -> Text:
    """One output line: never re-wrapped, never cropped by the text itself, no blanks at its end."""
    line = Text(no_wrap=True, overflow="ignore", end="\n")
    for part in parts:
        line.append_text(_text(part))
    line.rstrip()
    return line


def wrap_words(text: str | Text, width: int) -> list[Text]:
    """``text`` word-wrapped at ``width`` cells, at spaces only: a word wider than ``width`` stays
    whole (never folded), alone on its line. Explicit newlines are kept."""
    lines: list[Text] = []
    text = _text(text)
    text.rstrip()  # a folded YAML scalar's closing newline is no line of its own
    for line in text.split("\n", allow_blank=True):
        plain, offsets, start = line.plain, [], 0
        for word in _WORD.finditer(plain):
            if word.start() > start and cell_len(plain[start : word.end()].rstrip()) > width:
                offsets.append(word.start())
                start = word.start()
        for piece in line.divide(offsets):
            piece.rstrip()
            lines.append(piece)
    return lines or [Text()]


# a word, and its trailing blanks; a YAML key a workaround sets and its value are one word
# (``server_args.pp_size: 1``, ``env.ASCEND_USE_FIA: 0``: ``npudoctor.deployment.workarounds``)
_WORD = re.compile(r"(?:\b(?:server_args|env)\.\w+: (?=\S))?\S+\s*")


@dataclass
class Para:
    """``text`` word-wrapped at the width: the first line after ``indent`` spaces and ``lead``,
    the others after ``indent`` spaces and as many as ``lead`` is wide, or ``hang`` spaces when
    the lead is wider than ``max_hang``."""

    text: str | Text
    indent: int = 0
    lead: str | Text = ""
    style: str = ""
    max_hang: int = 24
    hang: int = 2

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        lead, text = _text(self.lead), _text(self.text, self.style)
        first = self.indent + lead.cell_len
        rest = first if lead.cell_len <= self.max_hang else self.indent + self.hang
        lines = wrap_words(text, max(options.max_width - first, MIN_TEXT_WIDTH))
        if rest != first and len(lines) > 1:  # the first line is narrower than the others: wrap them again
            remainder = text[len(lines[0].plain) :]
            remainder = remainder[len(remainder.plain) - len(remainder.plain.lstrip()) :]
            lines = lines[:1] + wrap_words(remainder, max(options.max_width - rest, MIN_TEXT_WIDTH))
        yield _line(" " * self.indent, lead, lines[0])
        for line in lines[1:]:
            yield _line(" " * rest, line)


@dataclass
class Whole:
    """One line, never wrapped nor ellipsized, whatever its length (a command to copy)."""

    text: str | Text
    indent: int = 0

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield _line(" " * self.indent, _text(self.text))


@dataclass
class Labelled:
    """``label value`` on one line when it fits the width; else the label on its line and the
    value whole on the next (a long path is never split)."""

    label: str | Text
    value: str | Text
    indent: int = 0

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        label, value = _text(self.label), _text(self.value)
        if self.indent + label.cell_len + 1 + value.cell_len <= options.max_width:
            yield _line(" " * self.indent, label, " ", value)
        else:
            yield _line(" " * self.indent, label)
            yield _line(value)


@dataclass
class Rows:
    """One line per row: the cells in columns as wide as their widest entry, two spaces apart,
    then the tail: ellipsized to the width (``wrap=False``), or word-wrapped under its column."""

    rows: Sequence[tuple[Sequence[str | Text], str | Text]]
    wrap: bool = False
    indent: int = 0
    gap: int = 2
    header: tuple[Sequence[str | Text], str | Text] | None = None
    max_widths: Sequence[int] = ()  # per column: a longer cell widens its own row only
    min_widths: Sequence[int] = ()  # per column: to line up with rows printed apart

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        every = ([self.header] if self.header else []) + list(self.rows)
        columns = max((len(cells) for cells, _ in every), default=0)
        caps = list(self.max_widths) + [1 << 30] * columns
        floors = list(self.min_widths) + [0] * columns
        widths = [
            max([floors[i]] + [_text(c[i]).cell_len for c, _ in every if i < len(c) and _fits(c[i], caps[i])])
            for i in range(columns)
        ]
        for cells, tail in every:
            prefix = Text(" " * self.indent)
            for i, width in enumerate(widths):
                cell = _text(cells[i]) if i < len(cells) else Text()
                cell.pad_right(max(width - cell.cell_len, 0))
                prefix.append_text(cell)
                prefix.append(" " * self.gap)
            room = options.max_width - prefix.cell_len
            tail_text = _text(tail)
            if not self.wrap:
                yield _line(prefix, ellipsize(tail_text, max(room, len(ELLIPSIS) + 1)))
                continue
            lines = wrap_words(tail_text, max(room, MIN_TEXT_WIDTH))
            for number, line in enumerate(lines):
                yield _line(prefix if number == 0 else " " * prefix.cell_len, line)


_BLANKS = re.compile(r"[ \t\n]+")


@dataclass
class Gist:
    """One line: ``whole`` (a location, never cut) and then ``rest`` ellipsized to the width; the rest
    is left out when too little room is left for it to say anything."""

    whole: str | Text
    rest: str | Text = ""
    indent: int = 0
    min_rest: int = 16

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        head = Text(" " * self.indent)
        head.append_text(_text(self.whole))
        # runs of blanks and newlines become one space; any other control character (a CR, say) is
        # left for the console to show escaped, never turned into a blank that hides it
        rest = _text(_BLANKS.sub(" ", self.rest).strip() if isinstance(self.rest, str) else self.rest)
        room = options.max_width - head.cell_len
        if rest.plain.strip() and room >= self.min_rest:
            said = ellipsize(rest, room, whole_words=True)
            if said.plain.removesuffix(ELLIPSIS).strip(" :;,-"):  # a word of it at least
                head.append_text(said)
        yield _line(head)


def _fits(cell: str | Text, cap: int) -> bool:
    return _text(cell).cell_len <= cap


def ellipsize(text: Text, width: int, whole_words: bool = False) -> Text:
    """``text`` cut to ``width`` cells with an ASCII ellipsis when longer (one line), after its last
    whole word that fits (a path or a name is left out, not cut), or mid-word when not even its
    first word fits; ``whole_words``: then nothing at all."""
    text = _text(text)
    if text.cell_len <= width:
        return text
    room = max(width - len(ELLIPSIS), 0)
    fits = text.plain[: room + 1]
    end = fits.rstrip().rfind(" ") if not fits[room:].isspace() else room
    if end <= 0 and whole_words:
        return Text()
    text.truncate(end if end > 0 else room, overflow="crop")
    text.rstrip()
    text.append(ELLIPSIS, style="dim")
    return text


class Uncropped:
    """A top-level renderable whose long lines survive ``console.print``'s cropping at the console
    width: printed at the full width it prints its content with ``crop=False`` itself, so a path,
    URL or command wider than the terminal is written whole (the terminal soft-wraps it) rather
    than cut. Nested in a narrower renderable (a panel, a table cell), it renders as its content."""

    def __init__(self, renderable: RenderableType) -> None:
        self.renderable = renderable

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if options.max_width < console.width:
            yield self.renderable
            return
        # Console.print crops what a renderable yields to the width; a print of our own during
        # the outer one lands in the same buffer, in order, uncropped.
        console.print(self.renderable, crop=False, highlight=False)


def print_whole(console: Console, *renderables: RenderableType) -> None:
    """Print without cropping lines at the console width (see the module docstring)."""
    console.print(*renderables, crop=False, highlight=False)


def group(parts: Iterable[RenderableType]) -> Group:
    return Group(*parts)


class Trimmed:
    """``renderable`` with the padding at the end of each line removed (rich's Markdown pads
    every line to the width: trailing blanks in a pipe, a log or a copied line)."""

    def __init__(self, renderable: RenderableType) -> None:
        self.renderable = renderable

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for line in console.render_lines(self.renderable, options, pad=False):
            while line and not line[-1].control and not line[-1].text.strip():
                line.pop()
            if line and not line[-1].control:
                last = line[-1]
                line[-1] = Segment(last.text.rstrip(), last.style, last.control)
            yield from line
            yield Segment.line()
