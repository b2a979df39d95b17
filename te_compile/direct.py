"""A rewritten graph that holds only te_compile's ops is called directly, without Inductor.

``flex_attention = torch.compile(flex_attention)`` (the usual way to run flex) and a compiled block that is just
an attention call give Dynamo a graph of one attention site. Once te_compile has served that site, the graph is
the op and a ``getitem``: Inductor would compile nothing, yet each call would still pass through its
wrappers (AOTAutograd's runtime wrapper, the compiled module's input checks and device guard) around the op.
Called directly, the graph runs the op through the dispatcher, whose Autograd kernel records the backward
(te_compile.ops) where an input requires a gradient, as AOTAutograd's would.

A node no output depends on is dropped only where Inductor would drop it too: it reads no graph input (so
it cannot mutate one) and draws no random numbers; flex's own empty-BlockMask construction, traced
into the graph of a call without a BlockMask, is such a node. Any other node keeps the graph with Inductor.

``TE_COMPILE_DIRECT=0`` (read at compile time) hands every graph to Inductor.
"""

from __future__ import annotations

import operator
import os
from typing import Callable, Optional

import torch
from torch.fx import Graph, GraphModule, Node


def _is_te_op(target: object) -> bool:
    return isinstance(target, torch._ops.OpOverload) and target.namespace == "te_compile"


#: names of the calls that draw from torch's random generators (a superset: a false match only keeps a graph with
#: Inductor)
_RANDOM = ("rand", "bernoulli", "normal", "dropout", "multinomial", "poisson", "seed", "uniform", "exponential",
           "cauchy", "geometric")


def _droppable(node: Node) -> bool:
    """May a node no output depends on be left out? Only a constant, or a call that cannot mutate a graph input
    (the caller checks that it reads none) and draws no random numbers."""
    if node.op == "get_attr":
        return True
    if node.op not in ("call_function", "call_method"):
        return False
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", repr(node.target))
    return not any(r in name.lower() for r in _RANDOM)


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
    if os.environ.get("TE_COMPILE_DIRECT", "1") == "0":
        return None
    reduced = attention_only(gm)
    return None if reduced is None else reduced.forward
