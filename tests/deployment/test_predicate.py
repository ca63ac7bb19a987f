"""A catalog record's ``bites_when``: an expression over one role's facts, interpreted (never
``eval``): what it may use, and what it reads from a real example deployment."""

from __future__ import annotations

from pathlib import Path

import pytest

from npudoctor.deployment.load import from_yaml
from npudoctor.deployment.predicate import PredicateError, compile_predicate, evaluate, role_namespace

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def holds(text: str, example: str, role: str, defaults: dict | None = None):
    facts = from_yaml(EXAMPLES / example, shell={}).facts
    (chosen,) = [r for r in facts.roles if r.name == role]
    return evaluate(compile_predicate(text, "test"), role_namespace(facts, chosen, defaults or {}))


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os').system('true')",
        "arg.__class__",
        "(lambda: 1)()",
        "[x for x in (1, 2)]",
        "config('a')['b']",
        "open('/etc/passwd')",
        "arg(name='page_size')",
        "unknown_name == 1",
    ],
)
def test_anything_but_the_small_language_is_refused_when_the_catalog_loads(text):
    with pytest.raises(PredicateError):
        compile_predicate(text, "test")


def test_facts_of_a_real_deployment():
    assert holds("role == 'decode' and mla and not indexer", "deepseek-v3-pd.yaml", "decode")
    assert holds("indexer and any_arch('DeepseekV32ForCausalLM')", "deepseek-v3.2-pd.yaml", "prefill")
    assert holds(
        "config('num_hidden_layers') == 61 and has_config('kv_lora_rank')", "deepseek-v3-pd.yaml", "prefill"
    )
    assert not holds("use_fia", "qwen3-moe-pd.yaml", "decode")
    assert holds("use_fia and env('ASCEND_USE_FIA') != ''", "qwen3-moe-pd-fia.yaml", "decode")
    assert holds("page_size == 128 and backend == 'ascend'", "qwen3-moe-pd.yaml", "prefill")
    assert holds("hybrid_linear > 0", "qwen3-next-decode.yaml", "decode")


def test_an_argument_not_given_takes_the_records_default():
    assert holds(
        "arg('chunked_prefill_size') == 8192", "qwen3-moe-pd.yaml", "prefill", {"chunked_prefill_size": 8192}
    )
    assert holds("arg('chunked_prefill_size') is none", "qwen3-moe-pd.yaml", "prefill")
    assert holds("arg('tp_size') == 4", "qwen3-moe-pd.yaml", "prefill", {"tp_size": 1})  # given wins


def test_an_absent_value_satisfies_no_ordering_and_breaks_nothing():
    assert not holds("arg('max_prefill_tokens') > 65535", "qwen3-moe-pd.yaml", "prefill")
    assert not holds("(arg('max_prefill_tokens') or 0) // 0 > 1", "qwen3-moe-pd.yaml", "prefill")
