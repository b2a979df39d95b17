"""Every cuDNN workaround te_compile applies, in one table: what it does, where it lives, the measured fact
behind it (a heading of docs/cudnn-notes.md) and the test that checks it.

The workarounds themselves live where they act (the emission options in ``lowering.lower.EmitOptions``, the
lowering's mask-first decisions, the run-time fixes in ``graphs``); this table is the index a maintainer reads first
when cuDNN changes (a new version can make one unnecessary, or need a new one). ``tests/test_workarounds.py``
checks that each row's place exists, its note heading is in docs/cudnn-notes.md, its test exists, and that
every emission option has a row.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Workaround:
    name: str
    #: what te_compile does differently from the straightforward emission
    does: str
    #: "module:attribute" under te_compile (an EmitOptions field as "lowering.lower:EmitOptions.<field>")
    where: str
    #: the start of a "## " heading of docs/cudnn-notes.md with the measurement
    note: str
    #: "tests/<file>.py::<test function>"
    test: str


WORKAROUNDS: tuple[Workaround, ...] = (
    Workaround("padded-tile guard", "masks kv positions past the key length after a score_mod whose f(-inf) is "
               "not -inf (cuDNN pads the last tile)", "lowering.lower:EmitOptions.kv_guard",
               "Found by the differential fuzzer", "tests/test_cudnn_decisions.py::test_padded_tile_guard"),
    Workaround("finite f(-inf) clamp", "min(f(s), s + BIG) after a score_mod finite at -inf, at every length",
               "lowering.lower:EmitOptions.ninf_clamp", "Found by an independent differential check",
               "tests/test_cudnn_decisions.py::test_neg_inf_clamp"),
    Workaround("distinct operands", "no op gets one tensor as two operands (the second use goes through identity)",
               "lowering.lower:EmitOptions.distinct_operands", "cuDNN versions",
               "tests/test_cudnn_versions.py::test_no_op_gets_one_tensor_twice"),
    Workaround("score through one identity", "the raw score reaches the score_mod through one identity op, so "
               "cuDNN's score tensor has a single consumer", "lowering.lower:EmitOptions.score_identity",
               "cuDNN versions", "tests/test_cudnn_versions.py::test_raw_score_has_one_consumer"),
    Workaround("inputs made full where needed", "a graph that would have an op with no full [B, H, L, S] operand "
               "(captured inputs and constants alone) gets its captured inputs broadcast to the score's shape first",
               "lowering.lower:EmitOptions.full_inputs_where_needed", "Found by the differential fuzzer",
               "tests/test_cudnn_decisions.py::test_full_inputs_leave_no_broadcast_only_op"),
    Workaround("no broadcast-only op", "a site whose emitted graph still has such an op stays with Inductor",
               "lowering.lower:EmitOptions.keep_broadcast_only", "Found by the differential fuzzer",
               "tests/test_cudnn_decisions.py::test_an_op_on_inputs_and_constants_alone_gets_full_inputs_or_is_kept"),
    Workaround("inputs made full everywhere (off)", "every graph with captured inputs gets them broadcast (for diagnosis)",
               "lowering.lower:EmitOptions.full_inputs", "Found by the differential fuzzer",
               "tests/test_cudnn_decisions.py::test_which_per_head_forms_get_full_inputs"),
    Workaround("constants by value", "constants enter as pass-by-value inputs, so a changed constant reuses the "
               "built graph and a bprop of mul(dS, constant) builds", "lowering.lower:EmitOptions.const_mode",
               "Found by the differential fuzzer", "tests/test_cudnn_decisions.py::test_graph_structure_ignores_constant_values"),
    Workaround("mask first", "a single index comparison mask is applied to the raw score before the score_mod, "
               "so cuDNN skips the masked tiles", "lowering.lower:Lowering.mask_first", "Tile skipping with a score_mod",
               "tests/test_cudnn_decisions.py::test_mask_first_lowering"),
    Workaround("mask first for causal only", "inverse causal (kv_idx >= q_idx) is emitted after the score_mod, not as "
               "a select on the raw score", "lowering.lower:EmitOptions.mask_first_inverse", "Found by the differential fuzzer",
               "tests/test_cudnn_decisions.py::test_mask_first_lowering"),
    Workaround("no singular function of a remainder", "a score_mod with log / sqrt / 1/x / x**p (p < 1) of a float "
               "remainder of the score stays with Inductor", "cudnn.check:singular_of_remainder",
               "Found by the differential fuzzer",
               "tests/test_cudnn_decisions.py::test_a_singular_function_of_a_remainder_of_the_score_is_kept"),
    Workaround("short keys with index terms", "a training call with at most 64 keys and a score_mod that reads q_idx / "
               "kv_idx stays with Inductor", "cudnn.check:SHORT_KEYS", "Found by the differential fuzzer",
               "tests/test_cudnn_decisions.py::test_short_keys_with_index_terms_are_kept_in_training"),
    Workaround("no super-exponential score_mod in training", "a training call whose score_mod applies exp to a "
               "function of the score that is not affine in it stays with Inductor", "cudnn.check:super_exponential",
               "Found by the differential fuzzer",
               "tests/test_cudnn_decisions.py::test_a_super_exponential_score_mod_is_kept_in_training"),
    Workaround("no singular derivative in training", "a training call whose score_mod applies log / sqrt / rsqrt / 1/x "
               "/ x**p (p < 1) to a function of the score that may reach 0 stays with Inductor",
               "cudnn.check:singular_derivative", "Found by the differential fuzzer",
               "tests/test_cudnn_decisions.py::test_a_derivative_singular_at_a_finite_score_is_kept_in_training"),
    Workaround("float32 bias for a learned table", "the bias gathered from a learned table is handed to cuDNN in "
               "float32 next to bf16 / fp16 q, k, v (dBias still comes back in q's dtype)",
               "passes.inserted:materialize_bias", "Found by the differential fuzzer",
               "tests/test_flex.py::test_a_learned_tables_bias_stays_float32"),
    Workaround("built-in band", "causal / sliding-window mask_mods without a score_mod run as cuDNN's diagonal band",
               "lowering.lower:diagonal_bounds", "Tile skipping with a score_mod",
               "tests/test_cudnn_decisions.py::test_builtin_band_recognition"),
    Workaround("built-in ALiBi", "ALiBi + causal with cuDNN's own slopes runs as use_alibi_mask with the causal band",
               "lowering.lower:builtin_alibi", "cuDNN's built-in ALiBi skips tiles",
               "tests/test_alibi.py::test_lowering_uses_builtin_alibi_only_where_exact"),
    Workaround("prefix-LM split", "a prefix-LM mask runs as two native calls and an lse merge",
               "lowering.prefix:split", "Prefix-LM on cuDNN", "tests/test_cudnn_decisions.py::test_prefix_split_recognition"),
    Workaround("version gate", "emitted score_mod / mask_mod graphs are served only on checked cuDNN versions",
               "cudnn.versions:emitted_reason", "cuDNN versions",
               "tests/test_cudnn_versions.py::test_emitted_graphs_are_served_only_on_checked_versions"),
)

__all__ = ["Workaround", "WORKAROUNDS"]
