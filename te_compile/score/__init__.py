"""The score_mod IR: what a flex score_mod / mask_mod means, as an expression te_compile can reason about.

``expr`` is the expression tree (s-expressions over q_idx, kv_idx, b, h, score and captured inputs), ``opdefs`` one
row per op (evaluation, kinds, derivative, cuDNN emission, infix form), ``ir`` the analyses over whole expressions
(simplification, derivatives, affinity, NaN-freedom) and ``infix`` the readable form reports print. Nothing here
imports torch.fx or cuDNN.
"""
