"""One small case per bug class the differential fuzzer found, shared by
the CPU tests (reference target, float64) and the CUDA tests (cuDNN, bf16 vs eager fp32)."""

from __future__ import annotations

from tools.fuzz import Case


def _score(body: str) -> str:
    return f"def score_mod(score, b, h, q_idx, kv_idx):\n    return {body}\n"


def _mask(body: str) -> str:
    return f"def mask_mod(b, h, q_idx, kv_idx):\n    return {body}\n"


def _table(name: str, shape: tuple, make: str = "randn", dtype: str = "float32", learned: bool = False) -> dict:
    return {"name": name, "shape": list(shape), "make": make, "dtype": dtype, "learned": learned}


#: the CUDA cases te_compile keeps, each with the category of its reason; every other CUDA case is served on cuDNN
#: (every site). tests/test_fuzz_classes.py checks these against the compile-time decisions on any machine
#: (``explain(..., for_device="cuda")``: a GPU with the frontend's CuTe DSL), tests/test_cuda_fuzz_classes.py against
#: the GPU's
CUDA_KEPT = {
    "autocast_sdpa": "not-on-cudnn",  # fp32 inputs under autocast: the compile-time check sees float32
    "kv_batch_1": "not-on-cudnn",
    "nan_score_under_gathering_mask": "not-exact",
    "pow_half_after_remainder_of_clamp": "not-exact",
    "q_index_term_ragged": "not-exact",
    "singular_derivative": "not-exact",
    "sqrt_after_clamp": "not-exact",
    "super_exponential_score": "not-exact",
    "threshold_per_batch": "not-on-cudnn",
}
#: ... and those kept where cuDNN's interval kernels cannot run (no CuTe DSL): served on them otherwise (a padding
#: length is a key interval), kept on the graph path
KEPT_WITHOUT_INTERVAL_KERNELS = {"lengths_per_batch": "sparse-mask"}


def cases(cuda: bool) -> dict[str, Case]:
    """class name -> Case. CUDA cases use lengths that are not multiples of the 128 tile."""
    n, m, d = (129, 255, 64) if cuda else (17, 23, 8)
    base = dict(B=2, H=2, HKV=2, L=n, S=m, D=d, DV=d, seed=7)
    s8 = 264 if cuda else m  # not a multiple of the 128 tile, a multiple of 8
    out = {
        # 1. the gradient through return_lse
        "lse_in_the_loss": Case(**base, score=_score("torch.tanh(score)"), return_lse=True, lse_loss=True),
        "lse_in_the_loss_causal": Case(**base, mask=_mask("q_idx >= kv_idx"), return_lse=True, lse_loss=True),
        # 2. a constant derivative is not affinity
        "step_not_folded": Case(**base, score=_score("score * 2 + (score > 0)")),
        "remainder_not_folded": Case(**base, score=_score("torch.remainder(score, 1.0)")),
        "negative_linear": Case(**base, score=_score("1 - 0.1 * score")),
        # 3. bool arithmetic
        "bool_plus_bool": Case(**base, score=_score("score + (q_idx >= kv_idx) * 1 + (q_idx <= kv_idx) * 1")),
        "score_minus_bool": Case(**base, score=_score("score - (q_idx >= kv_idx) * 1")),
        # 4. bounded score_mods at ragged lengths
        "sigmoid": Case(**base, score=_score("torch.sigmoid(score)")),
        "tanh_abs": Case(**base, score=_score("torch.tanh(torch.abs(score))")),
        "sqrt_abs": Case(**base, score=_score("torch.sqrt(torch.abs(score) + 0.5)")),
        # 5. NaN where eager is finite
        "square_of_scaled": Case(**base, score=_score("(score * 0.5) ** 2")),
        "abs_grad": Case(**base, score=_score("torch.abs(score)")),
        # 6. terms of the batch index
        "lengths_per_batch": Case(**base, mask=_mask("kv_idx < T0[b]"), captured=[_table("T0", ("B",), "randint:1:S+1", "int64")]),
        "offset_per_batch": Case(**base, mask=_mask("q_idx + T0[b] * 4 >= kv_idx"), captured=[_table("T0", ("B",), "randint:0:4", "int64")]),
        "threshold_per_batch": Case(**base, score=_score("torch.where(score <= T0[b], score, score * 0.5)"),
                                    captured=[_table("T0", ("B",))]),
        # 7. compound index masks
        "min_mask": Case(**base, mask=_mask("torch.minimum(kv_idx, q_idx - kv_idx) < 2 * b + 3")),
        "nested_or": Case(**base, mask=_mask("((q_idx >= kv_idx) & (q_idx - kv_idx < 9)) | (kv_idx < 4)")),
        "offset_band": Case(**base, mask=_mask("q_idx - 3 >= kv_idx")),
        "strict_causal": Case(**base, score=_score("3 + score"), mask=_mask("kv_idx < q_idx")),
        "score_mod_window": Case(**base, score=_score("torch.where(q_idx + 8 >= kv_idx, score, -float('inf'))")),
        # 8. crashes at run time
        "chained_index": Case(**base, score=_score("score + T0[b][q_idx] + T1[q_idx][kv_idx]"),
                              captured=[_table("T0", ("B", "L")), _table("T1", ("L", "S"))]),
        "log_emission": Case(**base, score=_score("torch.log(torch.abs(score) + 1.0)")),
        "where_two_constants": Case(**base, score=_score("score + torch.where(q_idx >= kv_idx, 0.5, -0.5)")),
        "kv_batch_1": Case(**base, kv_batch1=True, mask=_mask("q_idx >= kv_idx")),
        "sdpa_chain": Case(**{**base, "S": n}, kind="sdpa_chain"),
        "flex_chain": Case(**{**base, "S": n}, kind="flex_chain"),
        "blockmask_bh_terms": Case(**base, mask=_mask("(q_idx >= kv_idx) & (h >= 1)")),
        # 9. autocast
        "autocast_sdpa": Case(**{**base, "S": n}, kind="sdpa", is_causal=True, autocast=True),
        # learned tables (dBias) and rel-pos biases with index terms that must stay fp32
        # (S a multiple of 8 on CUDA: cuDNN builds no dBias backward otherwise, and such sites are kept)
        "learned_table": Case(**{**base, "S": s8}, score=_score("score + T0[h, q_idx - kv_idx + S - 1]".replace("S - 1", str(s8 - 1))),
                              captured=[_table("T0", ("H", "L+S-1"), learned=True)]),
        "alibi_plus_table": Case(**base, score=_score("-0.5 * score - T0[h, q_idx - kv_idx + S - 1] + T1[h] * (kv_idx - q_idx)".replace("S - 1", str(m - 1))),
                                 captured=[_table("T0", ("H", "L+S-1")), _table("T1", ("H",), "rand")]),
        # 10. a score_mod with a finite value at -inf at tile-multiple lengths (no mask, no padded tile): cuDNN's
        # backward still evaluates it at -inf positions (dV 40-140x off on 9.19 before the min(f(s), s + BIG) clamp)
        "tanh_tile_multiple": Case(**{**base, "L": 128 if cuda else 16, "S": 128 if cuda else 16, "H": 8, "HKV": 8,
                                      "D": 16, "DV": 16}, scale=0.3, score=_score("torch.tanh(score)"), return_lse=True),
        "sigmoid_tile_multiple": Case(**{**base, "L": 256 if cuda else 16, "S": 256 if cuda else 16},
                                      score=_score("torch.sigmoid(score)")),
        # 11. chained indexing of a learned table: eager flex's own gradient is wrong there (the fuzzer's eager
        # run reads T[a][b] as T[a, b]); te_compile's must be the table's true gradient
        # 12. an index term at a ragged L > S: padded query rows (q = 0) see f(0) = q_idx there (dQ / dK inf
        # on cuDNN 9.19 before the q_idx < L guard)
        "q_index_term_ragged": Case(**{**base, "B": 1, "L": 200 if cuda else 20, "S": 64 if cuda else 8, "DV": 2 * d},
                                    score=_score("(q_idx * 1) + score")),
        "chained_learned_table": Case(**{**base, "S": s8}, score=_score("score + T0[q_idx][kv_idx]"),
                                      captured=[_table("T0", ("L", "S"), learned=True)]),
        # 13. one tensor as both operands of an op (score * score; tanh's derivative squares tanh): cuDNN 9.27
        # ran such graphs into an illegal memory access (fixed by an identity op on the second operand)
        "score_times_score": Case(**{**base, "H": 4, "HKV": 4, "L": 512 if cuda else 16, "S": 512 if cuda else 16,
                                     "D": 32, "DV": 32}, score=_score("score * score")),
        # 14. a singular function after a select (clamp, where, min / max): eager's backward of the select masks the
        # gradient, so it is exactly 0 where the select picks a constant; the derived f' * where(c, 1, 0) gave
        # inf * 0 = nan there (dQ / dK inf; CPU fuzzer, seed 90210)
        "sqrt_after_clamp": Case(**base, score=_score("torch.sqrt(torch.clamp(score, min=0.0))")),
        "pow_half_after_remainder_of_clamp": Case(**base, score=_score(
            "torch.abs(torch.remainder(torch.clamp(score * 0.5, min=-1.0, max=1.0), 1.0)) ** 0.5")),
        # 15. an op with no full [B, H, L, S] operand: the bprop of this score_mod multiplies the per-head input by
        # 2 alone; cuDNN 9.19 and 9.27 ran it into a misaligned address (GPU fuzzer, GQA 2/1, DV = 2 D, L = S = 200),
        # so such graphs get their inputs broadcast to the score's shape first
        "broadcast_only_op": Case(**{**base, "HKV": 1, "L": 200 if cuda else 20, "S": 200 if cuda else 20, "DV": 2 * d},
                                  scale=0.3, captured=[_table("T0", ("H",), "rand")],
                                  score=_score("torch.sqrt(torch.abs(((score * 2) * T0[h] * (kv_idx - q_idx))) + 0.5)")),
        # 16. inverse causal as a select on the raw score (mask first): cuDNN skipped tiles as if causal, out ~100%
        # off at L = S = 200, D 128 (GPU fuzzer, cuDNN 9.19); now emitted after the score_mod like other masks
        "inverse_causal_mask_first": Case(**{**base, "B": 1, "H": 4, "HKV": 4, "L": 200 if cuda else n,
                                             "S": 200 if cuda else n, "D": 128 if cuda else d, "DV": 128 if cuda else d},
                                          mask=_mask("kv_idx >= q_idx"), return_lse=True,
                                          score=_score("-0.5 + (score * 0.5).float()")),
        # 17. a gathered additive term with a large per-row part, rounded into a bf16 bias (GPU fuzzer: out 27% off);
        # each bias row is shifted by its top now
        "large_gathered_bias": Case(**{**base, "H": 4, "HKV": 1, "L": 256 if cuda else n, "S": 128 if cuda else m},
                                    captured=[_table("T1", ("H", "L+S-1")), _table("T2", ("B",), "randint:0:8", "int64")],
                                    score=_score("torch.where(score >= 0.5, score, score * 0.5) + T1[h, q_idx - kv_idx + "
                                                 f"{(128 if cuda else m) - 1}] + torch.maximum(T2[b], q_idx + 7) * 1")),
        # 18. a score_mod that can be NaN under a gathering mask_mod: the mask becomes a -inf bias added after the
        # score_mod and NaN + -inf is NaN where flex's where() hides it (CPU fuzzer, seed 65001: out inf); kept
        "nan_score_under_gathering_mask": Case(seed=65001000852, B=1, H=2, HKV=2, L=1, S=5, D=8, DV=8,
                                               captured=[_table("T0", ("S",), "doc", "int64"), _table("T1", ("L",), "doc", "int64")],
                                               mask=_mask("T1[q_idx] == T0[kv_idx]"), score=_score("torch.log((score / -4.0))")),
        # 19. exp of a score_mod that is not affine in the score: the softmax is one-hot and cuDNN's backward leaves
        # rounding in P * (dP - delta) that eager cancels exactly (GPU fuzzer, seed 14001: grads 30% off); kept
        "super_exponential_score": Case(seed=14001000305, B=2, H=4, HKV=4, L=200 if cuda else n, S=200 if cuda else m,
                                        D=64 if cuda else d, DV=64 if cuda else d, return_lse=True, lse_loss=True,
                                        mask=_mask("(q_idx - kv_idx <= 10)"),
                                        score=_score("torch.exp((torch.abs((score * 2)) ** 1.5 ** 2) / 8.0)")),
        # 20. a derivative that is infinite at a finite score (sqrt of |score|): the gradient swings with the last
        # bits of the recomputed score (GPU fuzzer, seed 15003, cuDNN 9.27: dQ, dK 25x off); kept in training
        "singular_derivative": Case(seed=15003000015, B=2, H=2, HKV=2, L=n if not cuda else 255, S=m,
                                    D=128 if cuda else d, DV=64 if cuda else d, block=64, return_lse=True,
                                    scale=-0.3, captured=[_table("T0", ("L",)), _table("T1", ("B",), "randint:0:8", "int64")],
                                    mask=_mask("(kv_idx >= T1[b])"), score=_score("(torch.abs(score) ** 0.5 + T0[q_idx])")),
    }
    if not cuda:  # exact on the reference target only: a step of exp2 at an integer (bf16 moves it on cuDNN)
        # exp2 translated as exp(x ln 2) put remainder(exp2(4), 1) at 0.99999 instead of 0
        out["exp2_remainder"] = Case(**base, score=_score("torch.remainder(torch.exp2(torch.clamp(score * 2, max=4.0)), 1.0)"))
    if not cuda:  # eager's own float32 loss: the fuzzer's CPU reference in float64 after a float32 cast
        # exp of a cubed score reaches ~6e15; eager's backward cancels P * (dP - delta) in float32 and is off by
        # ~1e11 where the float64 math gives ~18 (te_compile matches the float64 math)
        out["float32_cast_ill_conditioned"] = Case(
            seed=43824, B=1, H=2, HKV=1, L=40, S=16, D=16, DV=16, return_lse=True,
            score=_score("torch.exp((((score * 1.5)).to(torch.float32) ** 3) / 8.0)"))
    return out
