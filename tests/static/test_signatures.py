"""npudoctor.static.signatures: static call binding agrees with CPython, and call sites are found with
their enclosing class and function."""

from __future__ import annotations

import ast

from hypothesis import given, settings
from hypothesis import strategies as st

from npudoctor.static.signatures import (
    CallShape,
    accepts_keyword,
    bind_errors,
    is_single_call_body,
    method_calls,
    names_read,
    only_raises,
)

NAMES = ("a", "b", "c", "d")


@st.composite
def signatures(draw):
    """``def f(self, <posonly> /, <params>, *args, <kwonly>, **kwargs)`` with trailing defaults."""
    names = list(NAMES)
    positional = draw(st.integers(0, 3))
    params = [names.pop(0) for _ in range(positional)]
    defaults = draw(st.integers(0, positional))
    posonly = draw(st.integers(0, positional))
    rendered = ["self"] + [p + ("=0" if i >= positional - defaults else "") for i, p in enumerate(params)]
    if posonly:
        rendered.insert(posonly + 1, "/")
    vararg = draw(st.booleans())
    kwonly = [(names.pop(0), draw(st.booleans())) for _ in range(draw(st.integers(0, min(2, len(names)))))]
    if vararg:
        rendered.append("*args")
    elif kwonly:
        rendered.append("*")
    rendered += [k + ("=0" if default else "") for k, default in kwonly]
    if draw(st.booleans()):
        rendered.append("**kwargs")
    return f"def f({', '.join(rendered)}):\n    pass\n"


@settings(max_examples=400, deadline=None)
@given(
    source=signatures(),
    positional=st.integers(0, 4),
    keywords=st.lists(st.sampled_from((*NAMES, "self", "other")), unique=True, max_size=3),
)
def test_bind_errors_agree_with_cpython(source, positional, keywords):
    namespace: dict = {}
    exec(source, namespace)  # noqa: S102 - a generated def, nothing else
    try:
        namespace["f"](None, *range(positional), **dict.fromkeys(keywords, 0))
        binds = True
    except TypeError:
        binds = False
    node = ast.parse(source).body[0]
    errors = bind_errors(node, CallShape(positional, tuple(keywords)))
    assert (not errors) == binds, (source, positional, keywords, errors)
    for keyword in keywords:
        if keyword != "self" and not accepts_keyword(node, keyword):
            assert not binds


def test_method_calls_know_their_class_and_function():
    module = ast.parse(
        "class Pool:\n"
        "    def get_cpu_copy(self, indices, k=None):\n"
        "        return self._kvcache.get_cpu_copy(indices, k=k)\n"
        "def offload(allocator):\n"
        "    allocator.get_cpu_copy(1, 2, *xs, **kw)\n"
        "    return None\n"
    )
    inner, outer = method_calls(module, ("get_cpu_copy",))
    assert (inner.class_node.name, inner.function.name, inner.receiver_text) == (
        "Pool",
        "get_cpu_copy",
        "self._kvcache",
    )
    assert CallShape.of(inner.call) == CallShape(1, ("k",))
    assert (outer.class_node, outer.function.name) == (None, "offload")
    assert CallShape.of(outer.call) == CallShape(2, (), star_args=True, star_kwargs=True)
    assert is_single_call_body(inner.function, inner.call) and not is_single_call_body(
        outer.function, outer.call
    )
    assert names_read(inner.function) >= {"self", "indices", "k"}
    # only the lines that mention the name are walked
    assert method_calls(module, ("get_cpu_copy",), lines=[5])[0].line == 5


def test_only_raises():
    stub, real = ast.parse(
        "def f(self):\n    '''doc'''\n    raise NotImplementedError('no')\n"
        "def g(self):\n    if x:\n        raise ValueError\n    return 1\n"
    ).body
    assert only_raises(stub) and not only_raises(real)
