"""Copies of FX graphs with their node metadata (a rewrite that fails half-way restores one; the whole-graph
check compiles one of each variant, since Inductor changes the graph it compiles)."""

from __future__ import annotations

import torch


def copy_graph(graph: torch.fx.Graph) -> torch.fx.Graph:
    """A copy of ``graph`` (nodes with their meta and the attributes Dynamo sets on them)."""
    new = torch.fx.Graph(owning_module=graph.owning_module, tracer_cls=graph._tracer_cls)
    val_map: dict = {}
    out = new.graph_copy(graph, val_map)
    new.output(out)
    for old, copy in val_map.items():  # attributes Dynamo sets on nodes (_dynamo_source, ...)
        for attr, value in getattr(old, "__dict__", {}).items():
            if not hasattr(copy, attr):
                setattr(copy, attr, value)
    return new


def copy_module(gm: torch.fx.GraphModule, graph: torch.fx.Graph) -> torch.fx.GraphModule:
    """A GraphModule over a copy of ``graph`` sharing ``gm``'s submodules and attributes."""
    return torch.fx.GraphModule(gm, copy_graph(graph))


__all__ = ["copy_graph", "copy_module"]
