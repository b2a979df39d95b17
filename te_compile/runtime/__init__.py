"""The run-time op: te_compile::attn_fwd / attn_bwd (``ops``: schema, registration, autograd, autocast), their CUDA,
reference and fake kernels (``kernels``: one runner lookup per call signature), the BlockMask check (``blockmask``),
``verify=True``'s first-call comparison (``verify``) and the direct call of a graph of only these ops (``direct``).
What runs on every compiled call lives here; what builds a runner lives in te_compile.cudnn.
"""
