"""A rewritten graph that holds only te_compile's ops is called directly, without Inductor.

``flex_attention = torch.compile(flex_attention)`` (the usual way to run flex) and a compiled block that is just
an attention call give Dynamo a graph of one attention site. Once te_compile has served that site, the graph is
the op and a ``getitem``: Inductor would compile nothing, yet each call would still pass through its
wrappers (AOTAutograd's runtime wrapper, the compiled module's input checks and device guard) around the op.
Called directly, the graph runs the op through the dispatcher, whose Autograd kernel records the backward
(te_compile.runtime.ops) where an input requires a gradient, as AOTAutograd's would.

A node no output depends on is dropped only where Inductor would drop it too: it reads no graph input (so
it cannot mutate one) and is a pure tensor op (``_DROPPABLE``); flex's own empty-BlockMask construction, traced
into the graph of a call without a BlockMask, is such a node. Any other node keeps the graph with Inductor:
a grad-mode or autocast switch around the op, for one, is a node nothing reads.

``TE_COMPILE_DIRECT=0`` (read at compile time) hands every graph to Inductor.
"""

from __future__ import annotations

import operator
from typing import Callable, Optional

import torch
from torch.fx import Graph, GraphModule, Node

from .. import env


def _is_te_op(target: object) -> bool:
    return isinstance(target, torch._ops.OpOverload) and target.namespace == "te_compile"


#: the calls a node no output depends on may make and still be left out: pure tensor ops on tensors the graph made
#: itself (what flex's empty-BlockMask construction traces: constants, comparisons, vmap's bookkeeping, which it
#: opens and closes among those nodes). Anything else keeps the graph with Inductor: a grad-mode or autocast switch
#: around the op (Dynamo records ``_set_grad_enabled`` / ``_enter_autocast`` as nodes nothing reads), a random draw.
_DROPPABLE = frozenset({
    # constructors and shape ops
    "ones", "zeros", "full", "empty", "arange", "tensor", "ones_like", "zeros_like", "full_like", "empty_like",
    "new_zeros", "new_ones", "new_full", "new_empty", "unsqueeze", "squeeze", "contiguous", "transpose", "permute",
    "view", "reshape", "expand", "expand_as", "flatten", "narrow", "select", "flip", "stack", "cat", "to", "int",
    "long", "bool", "float", "type", "clone", "size", "dim", "numel",
    # arithmetic, comparisons, reductions, indexing
    "add", "sub", "mul", "truediv", "floordiv", "mod", "neg", "pow", "abs", "remainder", "floor_divide", "min", "max",
    "clamp", "lt", "le", "gt", "ge", "eq", "ne", "and_", "or_", "invert", "bitwise_and", "bitwise_or",
    "logical_and", "logical_or", "logical_not", "where", "argsort", "sort", "sum", "cumsum", "any", "all",
    "getitem", "setitem", "index_select", "gather", "scatter", "scatter_", "masked_fill", "masked_fill_", "fill_",
    "copy_", "zero_", "add_", "sub_", "mul_",
    # vmap's bookkeeping in flex's traced BlockMask construction (opened and closed among the dropped nodes)
    "lazy_load_decompositions", "_vmap_increment_nesting", "_vmap_decrement_nesting", "_add_batch_dim",
    "_remove_batch_dim"})


def _droppable(node: Node) -> bool:
    """May a node no output depends on be left out? A constant, or a call in ``_DROPPABLE`` (the caller checks
    that it reads no graph input, so it cannot mutate one)."""
    if node.op == "get_attr":
        return True
    if node.op not in ("call_function", "call_method"):
        return False
    return (node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")) in _DROPPABLE


def attention_only(gm: GraphModule) -> Optional[GraphModule]:
    """``gm`` reduced to its placeholders, te_compile ops, their ``getitem`` s and the output, when that is all
    its outputs depend on and the rest may be dropped (module docstring); else None."""
    nodes = list(gm.graph.nodes)
    output = next(n for n in reversed(nodes) if n.op == "output")
    live: set = set()
    stack = [output]
    while stack:
        n = stack.pop()
        if n not in live:
            live.add(n)
            stack.extend(n.all_input_nodes)
    reads_input: set = set()
    for n in nodes:
        if n.op == "placeholder" or any(a in reads_input for a in n.all_input_nodes):
            reads_input.add(n)
    served = False
    for n in nodes:
        if n.op in ("placeholder", "output"):
            continue
        if n in live:
            if n.op != "call_function" or not (_is_te_op(n.target) or n.target is operator.getitem):
                return None
            served = served or _is_te_op(n.target)
        elif n in reads_input or not _droppable(n):
            return None
    if not served:
        return None
    graph = Graph()
    env: dict = {}
    for n in nodes:
        if n.op == "placeholder" or n in live:
            env[n] = graph.node_copy(n, lambda a: env[a])
    return GraphModule(gm, graph)


def direct_callable(gm: GraphModule) -> Optional[Callable]:
    """What Dynamo calls for ``gm`` when it holds only te_compile's ops (``attention_only``), else None."""
    if env.value("TE_COMPILE_DIRECT") == "0":
        return None
    reduced = attention_only(gm)
    return None if reduced is None else reduced.forward
