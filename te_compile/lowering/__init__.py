"""What cuDNN computes for a site: its lowering (``lower``: the Lowering record per spec and lengths, what the graph
path emits), cuDNN's own ALiBi (``alibi``), the prefix-LM split into two calls and a merge (``prefix``) and the
key intervals of a mask_mod that cuDNN's interval kernels take (``intervals``). Reads the score_mod IR
(te_compile.score); imports no cuDNN.
"""
