"""Keep secrets out of reports and messages.

Everything a user describes a deployment with can carry a credential: environment
variables (``HF_TOKEN``, ``AWS_SECRET_ACCESS_KEY``), sglang server arguments
(``--api-key``, ``--admin-api-key``), JSON-valued arguments with a key inside, URLs with a
password. Every place that puts such data into output (``Facts.to_dict``, ``npudoctor env``,
error lines that echo a command) goes through this module.

A *name* is secret when one of its words (split at ``_``, ``-``, ``.`` and camelCase) contains
a credential marker (``TOKEN``, ``KEY``, ``SECRET``, ``PASSWORD``, ...), except a few words
that only look like one (``TOKENS``, ``TOKENIZER``, ``BYPASS``: ``max_prefill_tokens`` is a
size, not a secret). Unknown compounds stay on the safe side: ``HFTOKEN`` is secret.
A *value* is also scrubbed of the credential parts of a URL (``https://user:***@host``, a query
parameter with a secret name: ``?token=***``, ``X-Amz-Signature=***``), of well-known token formats
(Hugging Face, GitHub, AWS access key ids, OpenAI-style keys), and of the secret keys of a JSON
object or list it holds (sglang ``json.loads`` the values of ``--json-model-override-args``,
``--hicache-storage-backend-extra-config`` and the like: the flag names no secret, a key inside
does), whatever the name it came under. A path argument is a ``pathlib.Path`` by the time an error
names it, which folds ``https://`` into ``https:/``: both are URLs here.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from npudoctor.results import Result

REDACTED = "***"

_MARKERS = re.compile(
    r"TOKEN|SECRET|PASSWORD|PASSWD|PASS|PWD|KEY|CREDENTIAL|AUTH|COOKIE|SESSION|PRIVATE|SIGNATURE",
)
# words that contain a marker but name no secret
_BENIGN_WORDS = frozenset(
    {
        "TOKENS",
        "TOKENIZER",
        "TOKENIZERS",
        "TOKENIZATION",
        "TOKENIZE",
        "DETOKENIZER",
        "DETOKENIZE",
        "BYPASS",
        "PASSTHROUGH",
        "COMPASS",
        "AUTHOR",
        "AUTHORS",
    }
)
_WORD_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")
# (a scheme starts where a run of scheme characters does: tried from every letter of a long word,
# the search would take quadratic time)
_URL_USERINFO = re.compile(
    r"(?<![A-Za-z0-9+.-])(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*:/{1,2})(?P<user>[^/\s:@]*):(?P<password>[^/\s@]+)@"
)
# a URL's query parameter (or a fragment's, as OAuth's implicit flow puts access_token there)
_URL_PARAMETER = re.compile(r"(?P<lead>[?&#;])(?P<name>[^=&#;?\s/]+)=(?P<value>[^?&#;\s'\"]*)")
_TOKEN_FORMATS = re.compile(
    r"\b(?:hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}|sk-[A-Za-z0-9_-]{20,}|xox[abprs]-[A-Za-z0-9-]{10,})\b"
)
_MAX_DEPTH = 32


def is_secret_name(name: object) -> bool:
    words = [w.upper() for w in _WORD_SPLIT.split(str(name)) if w]
    return any(_MARKERS.search(word) and word not in _BENIGN_WORDS for word in words)


def redact_value(value: str) -> str:
    """``value`` with URL passwords, well-known token formats and secret fields of a JSON
    object inside it replaced by ``***``."""
    text = _URL_USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:{REDACTED}@", value)
    if "=" in text:
        text = _URL_PARAMETER.sub(_parameter, text)
    text = _TOKEN_FORMATS.sub(REDACTED, text)
    stripped = text.strip()
    if stripped[:1] in ("{", "[") and len(stripped) < 1_000_000:
        try:
            parsed = json.loads(stripped)
        except (ValueError, RecursionError):
            return text
        if isinstance(parsed, (dict, list)):
            cleaned = redact_data(parsed)
            if cleaned != parsed:
                return json.dumps(cleaned)
    return text


def _parameter(match: re.Match[str]) -> str:
    # the value ends where the URL does: punctuation after it ends the phrase ("?token=X: no such file")
    value = match["value"].rstrip(":,.)")
    if not value or not is_secret_name(match["name"]):
        return match[0]
    return f"{match['lead']}{match['name']}={REDACTED}{match['value'][len(value) :]}"


def redact_data(data: Any, _depth: int = 0) -> Any:
    """A copy of JSON-like ``data`` with the values of secret keys and the secret parts of
    strings replaced (``server_args``, a parsed ``--watermark-config``, ...)."""
    if _depth > _MAX_DEPTH:
        return REDACTED
    if isinstance(data, dict):
        return {
            key: (REDACTED if is_secret_name(key) and value is not None else redact_data(value, _depth + 1))
            for key, value in data.items()
        }
    if isinstance(data, (list, tuple)):
        return type(data)(redact_data(item, _depth + 1) for item in data)
    if isinstance(data, str):
        return redact_value(data)
    return data


def redact_env(env: dict[str, str]) -> dict[str, str]:
    return {k: (REDACTED if is_secret_name(k) else redact_value(str(v))) for k, v in env.items()}


def redact_argv(words: list[str] | tuple[str, ...]) -> list[str]:
    """Command-line words with the values of secret flags (``--api-key X``, ``--api-key=X``)
    and of secret ``NAME=value`` assignments replaced, and every other value redacted as a value
    (a JSON object's secret keys, a URL's password). A word may hold a flag and its values
    (``"--api-key X"``, as a launch command's kept flags are recorded)."""
    out: list[str] = []
    secret_flag = False
    for word in words:
        text = str(word)
        if text.startswith("-"):
            flag, *joined = _FLAG_END.split(text, maxsplit=1)
            secret_flag = is_secret_name(flag.lstrip("-"))
            if joined:  # the flag and its value(s) in one word
                sep, value = joined
                out.append(f"{flag}{sep}{REDACTED if secret_flag else redact_value(value)}")
            else:  # a bare flag: its values are the words that follow
                out.append(redact_value(text))
            continue
        name, sep, value = text.partition("=")
        if secret_flag:
            out.append(REDACTED)
        elif sep and _ASSIGNED_NAME.fullmatch(name):
            out.append(f"{name}={REDACTED if is_secret_name(name) else redact_value(value)}")
        else:
            out.append(redact_value(text))
    return out


# where a flag word's flag ends and its value(s) begin: ``--x=1``, ``--x 1 2``
_FLAG_END = re.compile(r"(=|\s)")
_ASSIGNED_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def redact_result(result: Result) -> Result:
    """``result`` with URL passwords and well-known token formats removed from its free text
    (summary, evidence, notes, the exception): check text quotes sglang's exceptions, the live
    child's last words, the user's ignore reasons, any of which may hold a credential."""
    evidence = tuple(
        dataclasses.replace(e, expected=redact_value(e.expected), observed=redact_value(e.observed))
        for e in result.evidence
    )
    return dataclasses.replace(
        result,
        summary=redact_value(result.summary),
        evidence=evidence,
        assumptions=tuple(redact_value(a) for a in result.assumptions),
        ignored=None if result.ignored is None else redact_value(result.ignored),
        error=None if result.error is None else redact_value(result.error),
    )
