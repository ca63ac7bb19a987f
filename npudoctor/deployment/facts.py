"""What the checks need to know about a deployment, derived once.

``ModelFacts`` comes from the model's HF ``config.json``; ``RoleFacts`` from one
server's arguments and environment (a PD deployment has a prefill and a decode role,
a colocated server has one). Checks read these, never the raw inputs, so the three
ways of describing a deployment (YAML, launch command, flags) cannot disagree.
"""

from __future__ import annotations

import datetime as dt
import enum
import math
import re
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from npudoctor.deployment.limits import MAX_SERVER_SIZES
from npudoctor.errors import InputError, short_repr

# sglang's own default on Ascend (hardware_backend/npu/utils.py set_default_server_args).
NPU_DEFAULT_PAGE_SIZE = 128

# The largest count or size a deployment may state: sglang and the NPU kernels take these as
# 32-bit integers; anything larger is a typo, and would only make the probes loop or overflow.
MAX_INT = 2**31 - 1
# Server arguments are kept (and reported) as JSON data: how deep a value may nest.
_MAX_NESTING = 32
_DIGITS = re.compile(r"[0-9]+")

# Speculative algorithms whose draft model adds KV layers to the target's pool.
_DRAFT_LAYER_ALGORITHMS = {"EAGLE", "EAGLE3", "NEXTN", "MTP", "STANDALONE"}


class AttentionKind(str, enum.Enum):
    MHA = "mha"
    GQA = "gqa"
    MLA = "mla"
    MLA_INDEXER = "mla+indexer"

    @property
    def is_mla(self) -> bool:
        return self in (AttentionKind.MLA, AttentionKind.MLA_INDEXER)


@dataclass(frozen=True)
class ModelFacts:
    source: str
    model_type: str | None
    architectures: tuple[str, ...]
    attention: AttentionKind
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    v_head_dim: int
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    index_head_dim: int | None = None
    index_n_heads: int | None = None
    sliding_window: int | None = None
    hybrid_linear_layers: int = 0  # mamba / linear-attention layers beside full attention
    nextn_layers: int = 0  # MTP layers a speculative draft can use
    # the config.json keys and values (a multimodal wrapper's text_config merged in), for the
    # catalog's predicates (``npudoctor.deployment.predicate``); not in the report
    hf_config: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_hf_config(cls, config: dict[str, Any], source: str) -> ModelFacts:
        """Facts from an HF config dict; raises ``InputError`` naming a missing or bad key."""
        if not isinstance(config, dict):
            raise InputError(f"{source}: the model config must be a JSON object")
        text = dict(config)
        if isinstance(config.get("text_config"), dict):  # multimodal wrappers (Llama4, ...)
            text = {**config, **config["text_config"]}

        num_layers = _require_int(text, "num_hidden_layers", source)
        num_heads = _require_int(text, "num_attention_heads", source)
        num_kv_heads = _optional_int(text, "num_key_value_heads", source) or num_heads
        hidden = _optional_int(text, "hidden_size", source)
        head_dim = _optional_int(text, "head_dim", source) or (hidden // num_heads if hidden else None)
        if head_dim == 0:
            raise InputError(
                f"{source}: hidden_size {hidden} / num_attention_heads {num_heads} gives a head size of 0"
            )
        kv_lora_rank = _optional_int(text, "kv_lora_rank", source)
        index_head_dim = _optional_int(text, "index_head_dim", source)
        index_n_heads = _optional_int(text, "index_n_heads", source)

        if kv_lora_rank:
            kind = AttentionKind.MLA_INDEXER if (index_head_dim or index_n_heads) else AttentionKind.MLA
            qk_rope = _require_int(text, "qk_rope_head_dim", source)
            qk_nope = _optional_int(text, "qk_nope_head_dim", source) or 0
            head_dim = qk_nope + qk_rope
            v_head_dim = _optional_int(text, "v_head_dim", source) or head_dim
        else:
            if head_dim is None:
                raise InputError(f"{source}: needs head_dim or hidden_size to derive the head size")
            kind = AttentionKind.MHA if num_kv_heads == num_heads else AttentionKind.GQA
            qk_rope = None
            v_head_dim = _optional_int(text, "v_head_dim", source) or head_dim

        return cls(
            source=source,
            model_type=_optional_text(text, "model_type", source),
            architectures=_architectures(config.get("architectures"), source),
            attention=kind,
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            v_head_dim=v_head_dim,
            kv_lora_rank=kv_lora_rank,
            qk_rope_head_dim=qk_rope,
            index_head_dim=index_head_dim,
            index_n_heads=index_n_heads,
            sliding_window=_sliding_window(text, source),
            hybrid_linear_layers=_hybrid_linear_layers(text, num_layers, source),
            nextn_layers=(
                _optional_int(text, "num_nextn_predict_layers", source)
                or _optional_int(text, "mtp_num_hidden_layers", source)
                or 0
            ),
            hf_config=text,
        )


@dataclass(frozen=True)
class GivenArgument:
    """A server argument name exactly as the deployment passes it, and where: a ServerArgs field
    (``kind="field"``: a YAML ``server_args`` key, a ``--model-path`` flag) or a launch flag
    (``kind="flag"``, e.g. ``--tp-size``). Checked against the release (``npudoctor.target.serverargs``)."""

    kind: str  # "field" or "flag"
    name: str
    where: str  # e.g. "deploy.yaml: roles.decode.server_args", "launch command"


@dataclass(frozen=True)
class RoleFacts:
    """One sglang server process group: its parallelism, cache layout and code-path switches."""

    name: str
    disaggregation_mode: str  # "null", "prefill" or "decode"
    tp_size: int = 1
    pp_size: int = 1
    dp_size: int = 1
    attn_cp_size: int = 1
    prefill_context_parallel: bool = False
    page_size: int = NPU_DEFAULT_PAGE_SIZE
    kv_cache_dtype: str = "auto"
    attention_backend: str = "ascend"
    use_fia: bool = False
    speculative_algorithm: str | None = None
    draft_layers: int = 0
    transfer_backend: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    server_args: dict[str, Any] = field(default_factory=dict)
    unknown_args: tuple[str, ...] = ()
    given: tuple[GivenArgument, ...] = ()  # the names as passed, for the release to accept

    @property
    def can_offload_kv(self) -> bool:
        """A PD decode server offloads a retracted request's KV to CPU (ScheduleBatch.release_req)."""
        return self.disaggregation_mode == "decode"

    @property
    def uses_context_parallel(self) -> bool:
        return self.attn_cp_size > 1 or self.prefill_context_parallel


@dataclass(frozen=True)
class Facts:
    """A whole deployment. ``described`` is False when the user gave none: checks assume the worst."""

    model: ModelFacts | None
    roles: tuple[RoleFacts, ...]
    source: str
    env_from_shell: tuple[str, ...] = ()  # variables the roles took from the caller's environment

    @property
    def described(self) -> bool:
        return self.model is not None or bool(self.roles)

    def role(self, mode: str) -> RoleFacts | None:
        return next((r for r in self.roles if r.disaggregation_mode == mode), None)

    def to_dict(self) -> dict[str, Any]:
        """The report form, the one way a deployment leaves npudoctor (every format, ``advise``):
        secrets redacted (``npudoctor.deployment.redact``): environment by name, flags as written
        by flag, and every other value (paths, server arguments, JSON inside them) as a value."""
        from npudoctor.deployment.redact import redact_argv, redact_data, redact_env

        model = None
        if self.model:
            # not asdict(self.model): it copies every value of the model's config.json (a million
            # fit in the file's size limit) only for the copy to be dropped below
            model = {**asdict(replace(self.model, hf_config={})), "attention": self.model.attention.value}
            model.pop("hf_config")  # the model's own file; the facts above are what was read
        data: dict[str, Any] = {"source": self.source, "described": self.described}
        data["env_from_shell"] = list(self.env_from_shell)
        data["model"] = model
        data = redact_data(data)  # paths: the model's, the YAML's
        data["roles"] = []
        for role in self.roles:
            entry = {key: value for key, value in asdict(role).items() if key not in _REDACTED_APART}
            entry = redact_data(entry)  # the role's name, its backends (any text a user wrote)
            entry["env"] = redact_env(role.env)
            entry["server_args"] = redact_data(role.server_args)
            entry["unknown_args"] = redact_argv(role.unknown_args)
            data["roles"].append(entry)
        return data


# RoleFacts fields the report form redacts by their own rule (``given``: the raw names, which
# server_args and unknown_args report)
_REDACTED_APART = ("env", "server_args", "unknown_args", "given")


NO_DEPLOYMENT = Facts(model=None, roles=(), source="none")

# The MLA models checks assume when no model is given (DeepSeek-V3.2's dimensions, and V3's: the
# same without the NSA indexer), shared so that every check assumes the same model.
ASSUMED_MLA_INDEXER = ModelFacts(
    source="assumed (MLA with the NSA indexer, DeepSeek-V3.2 dimensions)",
    model_type=None,
    architectures=(),
    attention=AttentionKind.MLA_INDEXER,
    num_layers=61,
    num_heads=128,
    num_kv_heads=128,
    head_dim=192,
    v_head_dim=128,
    kv_lora_rank=512,
    qk_rope_head_dim=64,
    index_head_dim=128,
    index_n_heads=64,
    nextn_layers=1,
)
ASSUMED_MLA = replace(
    ASSUMED_MLA_INDEXER,
    source="assumed (MLA without indexer, DeepSeek-V3 dimensions)",
    attention=AttentionKind.MLA,
    index_head_dim=None,
    index_n_heads=None,
)
# The GQA model checks assume when no model is given (Qwen3-30B-A3B's attention dimensions).
ASSUMED_GQA = ModelFacts(
    source="assumed (GQA, 48 layers, 4 KV heads)",
    model_type=None,
    architectures=(),
    attention=AttentionKind.GQA,
    num_layers=48,
    num_heads=32,
    num_kv_heads=4,
    head_dim=128,
    v_head_dim=128,
)


def role_facts(
    name: str,
    server_args: dict[str, Any],
    env: dict[str, str],
    model: ModelFacts | None,
    unknown_args: tuple[str, ...] = (),
    where: str = "",
    given: tuple[GivenArgument, ...] = (),
) -> RoleFacts:
    """Facts for one role from sglang ServerArgs field names and its environment."""
    where = where or f"role {name}"
    server_args = plain_data(server_args, where)
    mode = str(server_args.get("disaggregation_mode") or "null")
    if mode not in ("null", "prefill", "decode"):
        raise InputError(f"{where}: disaggregation_mode must be null, prefill or decode, got {mode!r}")
    if mode == "null" and name in ("prefill", "decode"):
        mode = name  # a role named after its PD side
    elif name in ("prefill", "decode") and mode != name:
        raise InputError(f"{where}: role {name!r} has disaggregation_mode {mode!r}")

    def integer(key: str, default: int) -> int:
        value = server_args.get(key)
        if value is None:
            return default
        text = str(value).strip() if isinstance(value, (int, str)) and not isinstance(value, bool) else ""
        # ASCII digits only: str.isdigit() also accepts "²", which int() refuses
        if not _DIGITS.fullmatch(text) or len(text) > 10 or not 1 <= int(text) <= MAX_INT:
            raise InputError(
                f"{where}: {key} must be a positive integer up to {MAX_INT}, got {short_repr(value)}"
            )
        most = MAX_SERVER_SIZES.get(key)
        if most is not None and int(text) > most:
            raise InputError(
                f"{where}: {key} {int(text)} is larger than {most}, the most npudoctor probes"
                " (npudoctor/deployment/limits.py)"
            )
        return int(text)

    algorithm = server_args.get("speculative_algorithm")
    algorithm = str(algorithm).upper() if algorithm else None
    draft_layers = 0
    if algorithm in _DRAFT_LAYER_ALGORITHMS:
        draft_layers = (model.nextn_layers if model else 0) or 1
    backend = (
        server_args.get("decode_attention_backend" if mode == "decode" else "prefill_attention_backend")
        or server_args.get("attention_backend")
        or "ascend"
    )
    pp_size = integer("pp_size", 1)
    if model is not None and pp_size > model.num_layers:
        raise InputError(
            f"{where}: pp_size {pp_size} exceeds the model's {model.num_layers} layers "
            "(every pipeline stage holds at least one layer)"
        )
    transfer_backend = server_args.get("disaggregation_transfer_backend")
    return RoleFacts(
        name=name,
        disaggregation_mode=mode,
        tp_size=integer("tp_size", 1),
        pp_size=pp_size,
        dp_size=integer("dp_size", 1),
        attn_cp_size=integer("attn_cp_size", 1),
        prefill_context_parallel=any(
            _truthy(server_args.get(flag))
            for flag in (
                "enable_prefill_context_parallel",
                "enable_prefill_cp",
                "enable_nsa_prefill_context_parallel",
            )
        ),
        page_size=integer("page_size", NPU_DEFAULT_PAGE_SIZE),
        kv_cache_dtype=str(server_args.get("kv_cache_dtype") or "auto"),
        attention_backend=str(backend),
        use_fia=_truthy(env.get("ASCEND_USE_FIA", "false")),
        speculative_algorithm=algorithm,
        draft_layers=draft_layers,
        transfer_backend=None if transfer_backend is None else str(transfer_backend),
        env=dict(env),
        server_args=dict(server_args),
        unknown_args=tuple(unknown_args),
        given=tuple(given),
    )


def _truthy(value: Any) -> bool:
    """sglang's ``get_bool_env_var`` semantics ("true"/"1"), also for YAML booleans."""
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in ("true", "1")


def plain_data(value: Any, where: str) -> Any:
    """``value`` (server arguments) as the JSON data a report holds, or ``InputError`` naming what
    no launch command could pass: a YAML alias cycle, binary data, a set, a non-finite number, an
    integer out of 64-bit range, nesting deeper than any ServerArgs field. YAML dates become text
    (sglang's parser would get them as text). The size is bounded where the deployment is read
    (``npudoctor.deployment.limits``): a value shared by YAML aliases is converted once per place."""
    active: set[int] = set()

    def convert(item: Any, path: str, depth: int) -> Any:
        if item is None or isinstance(item, (bool, str)):
            return item
        if isinstance(item, int):
            if not -(2**63) <= item < 2**63:
                raise InputError(f"{where}: {path} is out of range (a 64-bit integer at most)")
            return item
        if isinstance(item, float):
            if not math.isfinite(item):
                raise InputError(f"{where}: {path} must be a finite number, got {item!r}")
            return item
        if isinstance(item, (dt.date, dt.time)):
            return item.isoformat()
        if not isinstance(item, (dict, list, tuple)):
            raise InputError(f"{where}: {path}: a {type(item).__name__} is not a server argument value")
        if depth >= _MAX_NESTING:
            raise InputError(f"{where}: {path} nests deeper than {_MAX_NESTING} levels")
        if id(item) in active:
            raise InputError(f"{where}: {path} refers to itself (a YAML alias cycle)")
        active.add(id(item))
        try:
            if isinstance(item, dict):
                converted = {}
                for key, sub in item.items():
                    if not isinstance(key, (str, int, float, bool, dt.date)) and key is not None:
                        raise InputError(f"{where}: {path}: a {type(key).__name__} is not a field name")
                    name = key.isoformat() if isinstance(key, dt.date) else str(key)
                    converted[name] = convert(sub, f"{path}.{name}" if path else name, depth + 1)
                return converted
            return [convert(sub, f"{path}[{index}]", depth + 1) for index, sub in enumerate(item)]
        finally:
            active.discard(id(item))

    return convert(value, "server_args", 0)


def _optional_int(config: dict[str, Any], key: str, source: str) -> int | None:
    value = config.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"{source}: {key} must be an integer, got {short_repr(value)}")
    if not 0 <= value <= MAX_INT:
        raise InputError(f"{source}: {key} must be between 0 and {MAX_INT}, got {short_repr(value)}")
    return value


def _optional_text(config: dict[str, Any], key: str, source: str) -> str | None:
    value = config.get(key)
    if value is not None and not isinstance(value, str):
        raise InputError(f"{source}: {key} must be text, got {short_repr(value)}")
    return value


def _architectures(value: Any, source: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
        raise InputError(f"{source}: architectures must be a list of class names, got {short_repr(value)}")
    return tuple(value)


def _require_int(config: dict[str, Any], key: str, source: str) -> int:
    value = _optional_int(config, key, source)
    if value is None:
        raise InputError(f"{source}: missing {key}")
    if value < 1:
        raise InputError(f"{source}: {key} must be positive, got {value}")
    return value


def _sliding_window(config: dict[str, Any], source: str) -> int | None:
    for key in ("sliding_window", "attention_chunk_size"):
        window = config.get(key)
        if isinstance(window, int) and not isinstance(window, bool) and window > 0:
            layer_types = config.get("layer_types")
            if config.get("use_sliding_window") is False and not layer_types:
                return None
            return window
    return None


def _hybrid_linear_layers(config: dict[str, Any], num_layers: int, source: str) -> int:
    layer_types = config.get("layer_types")
    if isinstance(layer_types, list):
        return sum(1 for t in layer_types if isinstance(t, str) and ("linear" in t or "mamba" in t))
    interval = _optional_int(config, "full_attention_interval", source)
    if interval and interval > 1:
        return num_layers - num_layers // interval
    return 0
