"""Keep secrets out of reports and messages.

Everything a user describes a deployment with can carry a credential: environment
variables (``HF_TOKEN``, ``AWS_SECRET_ACCESS_KEY``), sglang server arguments
(``--api-key``, ``--admin-api-key``), JSON-valued arguments with a key inside, URLs with a
password. Every place that puts such data into output (``Facts.to_dict``, ``npudoctor env``,
error lines that echo a command) goes through this module.

A *name* is secret when one of its words (split at ``_``, ``-``, ``.`` and camelCase) contains
a credential marker (``TOKEN``, ``KEY``, ``SECRET``, ``PASSWORD``, ...), except a few words
that only look like one (``TOKENS``, ``TOKENIZER``, ``BYPASS``: ``max_prefill_tokens`` is a
size, not a secret), or is a short credential word that would be part of too many ordinary words
to be a marker (``PAT``, ``JWT``, ``SIG``, ``CREDS``, ``BEARER``: ``ASCEND_PAT`` is secret,
``MODEL_PATH`` and ``SIGNAL`` are not). Unknown compounds stay on the safe side: ``HFTOKEN`` is
secret. A *value* is also scrubbed of the credential parts of a URL (``https://user:***@host``, a
token given as the user, ``https://***@host``, and ``user:***@host`` without a scheme, a query
parameter with a secret name: ``?token=***``, ``?sig=***``, ``X-Amz-Signature=***``), of an HTTP
credential (``Authorization: Basic ***``, ``Bearer ***``), of well-known token formats (Hugging
Face, GitHub, AWS access key ids, OpenAI-style keys, JSON Web Tokens), and of the secret keys of a
JSON object or list it holds (sglang ``json.loads`` the values of ``--json-model-override-args``,
``--hicache-storage-backend-extra-config`` and the like: the flag names no secret, a key inside
does), whatever the name it came under. A path argument is a ``pathlib.Path`` by the time an error
names it, which folds ``https://`` into ``https:/``: both are URLs here.

A command npudoctor prints for the user to paste (a finding's ``npudoctor fix ...``, a catalog
workaround's launch command) cannot hold ``***``: pasted, ``--api-key '***'`` would start sglang
with the key ``***``. There a secret is a reference to a shell variable named after it that the
shell refuses to expand while it is unset (``--api-key "${API_KEY:?redacted}"``,
``HF_TOKEN="${HF_TOKEN:?redacted}"``): ``redact_argv(words, for_shell=True)`` marks each secret,
and ``npudoctor.terminal.shell_join`` writes the marks as such references (``shell_variable``).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from npudoctor.terminal import is_shell_variable, shell_variable

if TYPE_CHECKING:
    from npudoctor.results import Result

REDACTED = "***"

_MARKERS = re.compile(
    r"TOKEN|SECRET|PASSWORD|PASSWD|PASS|PWD|KEY|CREDENTIAL|AUTH|COOKIE|SESSION|PRIVATE|SIGNATURE",
)
# credential words that are too short to be looked for inside a word (PAT in PATH, SIG in SIGNAL)
_SECRET_WORDS = frozenset(
    {"PAT", "PATS", "JWT", "JWTS", "SIG", "SIGS", "CRED", "CREDS", "BEARER", "OTP", "PSK"}
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
# a URL whose user is a token (no password): https://TOKEN@host
_URL_USER = re.compile(r"(?<![A-Za-z0-9+.-])(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*:/{1,2})(?P<user>[^/\s:@?#]+)@")
# user:password@host without a scheme (a proxy, a peer); not an image's tag before its digest
# (sglang:0.5.12@sha256:...) nor what follows a path or another URL part
_BARE_USERINFO = re.compile(
    r"(?<![A-Za-z0-9+.:/@%_~-])(?P<user>[A-Za-z0-9._~%+-]+):(?P<password>[^/\s@:]+)@(?=[A-Za-z0-9\[])(?!sha\d+:)"
)
# an HTTP credential: a header's value after its scheme, or a bearer token anywhere (a token has a
# digit or is long: "bearer of bad news" is prose)
_AUTHORIZATION = re.compile(
    r"(?i)(?P<lead>\b(?:proxy-)?authorization\s*[:=]\s*(?:(?:bearer|basic|digest|token|negotiate)\s+)?)"
    r"(?P<credential>[^\s,;'\"]+)"
)
_BEARER = re.compile(
    r"(?i)(?P<lead>\bbearer\s+)(?P<credential>(?=[A-Za-z0-9._~+/-]*[0-9])[A-Za-z0-9._~+/-]+=*|[A-Za-z0-9._~+/-]{20,}=*)"
)
# a JSON Web Token: base64url header (a JSON object: "eyJ"), payload and signature (empty if unsigned)
_JWT = re.compile(r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*")
# a URL's query parameter (or a fragment's, as OAuth's implicit flow puts access_token there)
_URL_PARAMETER = re.compile(r"(?P<lead>[?&#;])(?P<name>[^=&#;?\s/]+)=(?P<value>[^?&#;\s'\"]*)")
_TOKEN_FORMATS = re.compile(
    r"\b(?:hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}|sk-[A-Za-z0-9_-]{20,}|xox[abprs]-[A-Za-z0-9-]{10,})\b"
)
_MAX_DEPTH = 32


# What stands for a secret: ``***`` in a report; the mark of a shell reference named after the
# secret (``npudoctor.terminal.shell_variable``) in a command to paste.
Mask = Callable[[str], str]


def _report_mask(_name: str) -> str:
    return REDACTED


def _shell_mask(name: str) -> str:
    variable = re.sub(r"[^A-Za-z0-9_]+", "_", name.strip("-")).strip("_").upper() or "SECRET"
    return shell_variable("_" + variable if variable[0].isdigit() else variable)


def _is_masked(text: str) -> bool:
    return text == REDACTED or is_shell_variable(text)


def is_secret_name(name: object) -> bool:
    words = [w.upper() for w in _WORD_SPLIT.split(str(name)) if w]
    return any(
        word in _SECRET_WORDS or (_MARKERS.search(word) and word not in _BENIGN_WORDS) for word in words
    )


def redact_value(value: str, mask: Mask = _report_mask) -> str:
    """``value`` with URL credentials, HTTP credentials, well-known token formats and secret fields
    of a JSON object inside it replaced by ``***`` (``mask``: what stands for a secret of a name)."""

    def masked(name: str, lead: str, secret: str) -> str:
        return f"{lead}{secret if _is_masked(secret) else mask(name)}"

    text = _URL_USERINFO.sub(
        lambda m: masked("PASSWORD", f"{m['scheme']}{m['user']}:", m["password"]) + "@", value
    )
    if "@" in text:
        text = _URL_USER.sub(lambda m: masked("TOKEN", m["scheme"], m["user"]) + "@", text)
        text = _BARE_USERINFO.sub(lambda m: masked("PASSWORD", f"{m['user']}:", m["password"]) + "@", text)
    if "=" in text:
        text = _URL_PARAMETER.sub(lambda m: _parameter(m, mask), text)
    lowered = text.lower()
    if "auth" in lowered or "bearer" in lowered:
        text = _AUTHORIZATION.sub(lambda m: masked("TOKEN", m["lead"], m["credential"]), text)
        text = _BEARER.sub(lambda m: masked("TOKEN", m["lead"], m["credential"]), text)
    text = _TOKEN_FORMATS.sub(lambda m: mask("TOKEN"), text)
    if "eyJ" in text:
        text = _JWT.sub(lambda m: mask("TOKEN"), text)
    stripped = text.strip()
    if stripped[:1] in ("{", "[") and len(stripped) < 1_000_000:
        try:
            parsed = json.loads(stripped)
        except (ValueError, RecursionError):
            return text
        if isinstance(parsed, (dict, list)):
            cleaned = redact_data(parsed, mask=mask)
            if cleaned != parsed:
                return json.dumps(cleaned)
    return text


def _parameter(match: re.Match[str], mask: Mask) -> str:
    # the value ends where the URL does: punctuation after it ends the phrase ("?token=X: no such file")
    value = match["value"].rstrip(":,.)")
    if not value or _is_masked(value) or not is_secret_name(match["name"]):
        return match[0]
    return f"{match['lead']}{match['name']}={mask(match['name'])}{match['value'][len(value) :]}"


def redact_data(data: Any, _depth: int = 0, mask: Mask = _report_mask) -> Any:
    """A copy of JSON-like ``data`` with the values of secret keys and the secret parts of
    strings replaced (``server_args``, a parsed ``--watermark-config``, ...)."""
    if _depth > _MAX_DEPTH:
        return REDACTED
    if isinstance(data, dict):
        return {
            key: (
                mask(str(key))
                if is_secret_name(key) and value is not None
                else redact_data(value, _depth + 1, mask)
            )
            for key, value in data.items()
        }
    if isinstance(data, (list, tuple)):
        return type(data)(redact_data(item, _depth + 1, mask) for item in data)
    if isinstance(data, str):
        return redact_value(data, mask)
    return data


def redact_env(env: dict[str, str]) -> dict[str, str]:
    return {k: (REDACTED if is_secret_name(k) else redact_value(str(v))) for k, v in env.items()}


def redact_argv(words: list[str] | tuple[str, ...], for_shell: bool = False) -> list[str]:
    """Command-line words with the values of secret flags (``--api-key X``, ``--api-key=X``)
    and of secret ``NAME=value`` assignments replaced, and every other value redacted as a value
    (a JSON object's secret keys, a URL's password). A word may hold a flag and its values
    (``"--api-key X"``, as a launch command's kept flags are recorded), or a secret's name and its
    value without the ``=`` (``"DB_PASSWORD hunter2"``, a malformed ``--env``). ``for_shell``: for a
    command to paste, each secret marked as a shell variable (``shell_variable``) instead of ``***``."""
    mask = _shell_mask if for_shell else _report_mask
    out: list[str] = []
    secret_flag = ""
    for word in words:
        text = str(word)
        if text.startswith("-"):
            flag, *joined = _FLAG_END.split(text, maxsplit=1)
            secret_flag = flag if is_secret_name(flag.lstrip("-")) else ""
            if joined:  # the flag and its value(s) in one word
                sep, value = joined
                out.append(f"{flag}{sep}{mask(flag) if secret_flag else redact_value(value, mask)}")
            else:  # a bare flag: its values are the words that follow
                out.append(redact_value(text, mask))
            continue
        name, sep, value = text.partition("=")
        spaced = _SPACED_ASSIGNMENT.fullmatch(text)
        if secret_flag:
            out.append(mask(secret_flag))
        elif sep and _ASSIGNED_NAME.fullmatch(name):
            out.append(f"{name}={mask(name) if is_secret_name(name) else redact_value(value, mask)}")
        elif spaced and is_secret_name(spaced["name"]):
            out.append(f"{spaced['name']}{spaced['sep']}{mask(spaced['name'])}")
        else:
            out.append(redact_value(text, mask))
    return out


# where a flag word's flag ends and its value(s) begin: ``--x=1``, ``--x 1 2``
_FLAG_END = re.compile(r"(=|\s)")
_ASSIGNED_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# a name and its value apart by blanks or a colon, not an equals sign: ``DB_PASSWORD hunter2``
_SPACED_ASSIGNMENT = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?P<sep>\s+|:\s*)(?P<value>\S.*)", re.S)


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
