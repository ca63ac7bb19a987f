"""What npudoctor prints for a terminal shows the user's text, and never commands the terminal.

Much of what the text formats print was written by someone else: a YAML file's name, an environment
value, a server argument a check quotes, a path, a release's version string. A control character
in it would act on the reader's terminal rather than be read: ESC starts the sequences that set the
window title, clear the screen, move the cursor, write the clipboard or make a link; ``\\x9b`` is
ESC [ to a terminal that reads 8-bit controls; CR and backspace overwrite what was printed; a
bidirectional override reorders what is shown. Each is shown escaped instead (``\\x1b``, ``\\r``,
``\\u202e``), as Python writes it in a string literal.

Every console the text formats print on is a ``TerminalConsole``: it escapes them in what any
renderable yields, so no formatter has to remember to. (rich markup in a value needs nothing here:
the reports build ``Text``, which is never parsed as markup, and ``rich.markup.escape`` what goes
into markup.) The formats for CI tools show them the same way (Markdown, JUnit and GitHub
annotations call ``printable``), the JSON formats escape them as JSON does; stderr's lines go
through ``printable`` (``npudoctor.cli.output.say``).

A command npudoctor prints for the user to paste (``shell_join``) quotes such a word the way
bash, zsh and ksh93 read escapes, ``$'...'``: it shows no control character and
pastes as the very value the user gave. A secret redacted from it for the shell
(``npudoctor.deployment.redact.redact_argv(..., for_shell=True)``, which marks it with
``shell_variable``) is written as a reference to a variable the shell refuses to expand while it is
unset: ``"${API_KEY:?redacted}"``.
"""

from __future__ import annotations

import re
import secrets
import shlex
from collections.abc import Iterable, Sequence

from rich.console import Console, ConsoleOptions, RenderableType
from rich.segment import Segment

# C0 but tab and newline (which the layout itself writes), DEL, C1, and Unicode's bidirectional
# controls (the "Trojan Source" characters) and line and paragraph separators
_CONTROL_RANGES = ((0x00, 0x08), (0x0B, 0x1F), (0x7F, 0x9F), (0x61C, 0x61C), (0x200E, 0x200F),
                   (0x2028, 0x202E), (0x2066, 0x2069))  # fmt: skip
_CONTROL_CODES = [code for low, high in _CONTROL_RANGES for code in range(low, high + 1)]
_CONTROLS = re.compile("[" + "".join(f"{chr(low)}-{chr(high)}" for low, high in _CONTROL_RANGES) + "]")
# as a Python string literal writes each (str.translate: a long value costs no Python call per character)
_ESCAPES = {code: repr(chr(code))[1:-1] for code in _CONTROL_CODES}
# inside $'...': \xHH for ASCII, \uHHHH else (the shell writes it in the locale's encoding, UTF-8, as
# it came); the backslash and the quote escaped
_SHELL_ESCAPES = {
    **{
        code: (f"\\x{code:02x}" if code < 0x80 else f"\\u{code:04x}")
        for code in [*_CONTROL_CODES, 0x09, 0x0A]
    },
    ord("\\"): "\\\\",
    ord("'"): "\\'",
}


def printable(text: str) -> str:
    """``text`` with every control character written as its escape (``\\x1b``); tab and newline kept."""
    return text.translate(_ESCAPES) if _CONTROLS.search(text) else text


def shell_join(words: Sequence[str]) -> str:
    """``shlex.join(words)``, but a word with a control character (tab and newline too) is quoted
    as ``$'...'`` with the character escaped (``$'A=x\\x1b[2J'``), and a secret redacted for the
    shell is a reference to its variable (``HF_TOKEN="${HF_TOKEN:?redacted}"``)."""
    return " ".join(
        "".join(
            f'"${{{text}:?redacted}}"' if secret else _quoted(text) for text, secret in _variables_in(word)
        )
        for word in words
    )


# A shell variable standing in a word (``shell_variable``): the mark holds a nonce of this process,
# so that no value a user wrote can pass for one.
_NONCE = f"npudoctor{secrets.token_hex(8)}x"
_VARIABLE_MARK = re.compile(f"{_NONCE}([A-Z_][A-Z0-9_]*){_NONCE}")


def shell_variable(name: str) -> str:
    """A word (or part of one) that ``shell_join`` writes as a reference to the shell variable
    ``name`` (a valid name), which the shell refuses to expand while it is unset."""
    return f"{_NONCE}{name}{_NONCE}"


def is_shell_variable(text: str) -> bool:
    return text.startswith(_NONCE)


def _variables_in(word: str) -> list[tuple[str, bool]]:
    """``word`` in pieces: ``(text, False)`` as given, ``(NAME, True)`` where ``shell_variable``
    marked the variable NAME."""
    pieces: list[tuple[str, bool]] = []
    start = 0
    for match in _VARIABLE_MARK.finditer(word):
        if match.start() > start:
            pieces.append((word[start : match.start()], False))
        pieces.append((match[1], True))
        start = match.end()
    if start < len(word) or not pieces:
        pieces.append((word[start:], False))
    return pieces


def _quoted(word: str) -> str:
    if not _CONTROLS.search(word) and "\t" not in word and "\n" not in word:
        return shlex.quote(word)
    return "$'" + word.translate(_SHELL_ESCAPES) + "'"


class TerminalConsole(Console):
    """A rich ``Console`` whose output holds no control character of the text it prints: each
    is escaped (``printable``) in the segments any renderable yields; the console's own styling
    and cursor control are added after that (style rendering, control segments) and kept."""

    def render(self, renderable: RenderableType, options: ConsoleOptions | None = None) -> Iterable[Segment]:
        for segment in super().render(renderable, options):
            if segment.control or not _CONTROLS.search(segment.text):
                yield segment
            else:
                yield Segment(printable(segment.text), segment.style)
