"""Score_mods and mask_mods of PyTorch's flex_attention tests and of attention-gym, re-expressed
in our own short code for the differential fuzzer.

Each ``Peer`` names where its form comes from (PyTorch ``test/inductor/test_flex_attention.py`` and
a few siblings, or attention-gym ``attn_gym/mods`` / ``attn_gym/masks`` / ``examples``). Helpers of
the sources (``and_masks`` / ``or_masks`` / ``generate_*`` closures / small inner functions) are
inlined into one top-level ``score_mod`` or ``mask_mod``; constants are baked in, scaled down to
matter for sequences of 1..300 tokens. Tensors the sources capture are described by ``Captured``
and built by ``build_globals``; where a source needs a table of a fixed size (relative-position
tables sized for the longest sequence), it is sized for 300 tokens.

Captured contents are random: only the form of each function (its gathers, index arithmetic and
pointwise ops) follows the source, not e.g. that ``offsets`` agree with ``document_id``.
"""
from __future__ import annotations

import dataclasses
import math

import torch


@dataclasses.dataclass(frozen=True)
class Captured:
    name: str          # the global name the function reads
    shape: tuple       # of ints or the symbols "B", "H", "L", "S", "HKV" (query heads H, kv heads HKV, query length L, kv length S); e.g. ("H",), ("B",), ("L", "S"), ("H", "2*S"), or an int; a symbol entry is a Python expression of them ("L+S", "max(L,S)", "S//16+1")
    make: str          # one of: "randn", "rand", "randint:LO:HI" (ints, HI exclusive; may use symbols, e.g. "randint:1:S+1"), "doc" (sorted int document ids 0..3 along the last dim), "arange", "bool" (random bools)
    dtype: str = "float32"   # "float32" | "int64" | "int32" | "bool"
    learned: bool = False    # True when the peer's source trains it (requires_grad)


@dataclasses.dataclass(frozen=True)
class Peer:
    name: str                 # short unique id, e.g. "pt_times_two", "gym_softcap"
    source: str               # where the form comes from
    kind: str                 # "score" or "mask"
    code: str                 # Python source of ONE top-level function score_mod / mask_mod
    captured: tuple = ()      # tuple[Captured, ...]


_T = "pytorch test/inductor/test_flex_attention.py: "
_G = "attention-gym "
_SM = "def score_mod(score, b, h, q_idx, kv_idx):\n"
_MM = "def mask_mod(b, h, q_idx, kv_idx):\n"
_NL = "max(L,S)"  # a table indexed by both q_idx and kv_idx


def _score(name: str, source: str, body: str, *captured: Captured) -> Peer:
    return Peer(name, source, "score", _SM + body, tuple(captured))


def _mask(name: str, source: str, body: str, *captured: Captured) -> Peer:
    return Peer(name, source, "mask", _MM + body, tuple(captured))


PEERS: tuple[Peer, ...] = (
    # ------------------------------------------------------------------ PyTorch: module-level score_mods
    _score("pt_identity", _T + "_identity (torch.nn.attention.flex_attention._identity; noop_mod of test_fully_masked_out_rows)",
           "    return score\n"),
    _score("pt_causal", _T + "_causal (also attention-gym examples/flex_attn.ipynb: causal_bias)",
           "    return torch.where(q_idx >= kv_idx, score, float('-inf'))\n"),
    _score("pt_rel_bias", _T + "_rel_bias (scoremod_1 of test_multiple_score_mod_calls)",
           "    return score + (q_idx - kv_idx)\n"),
    _score("pt_rel_causal", _T + "_rel_causal",
           "    return torch.where(q_idx >= kv_idx, score + (q_idx - kv_idx), float('-inf'))\n"),
    _score("pt_alibi", _T + "_generate_alibi_bias(8) (same formula: attention-gym attn_gym/mods/alibi.py: generate_alibi_bias)",
           "    slope = torch.exp2(-((h + 1) * 8.0 / 8))\n"
           "    return score + (kv_idx - q_idx) * slope\n"),
    _score("pt_inverse_causal", _T + "_inverse_causal",
           "    return torch.where(q_idx <= kv_idx, score, float('-inf'))\n"),
    _score("pt_times_two", _T + "_times_two (also test_max_autotune, test_float32_matmul_precision)",
           "    return score * 2\n"),
    _score("pt_squared", _T + "_squared",
           "    return score * score\n"),
    _score("pt_head_offset", _T + "_head_offset",
           "    return score * head_offset[h]\n",
           Captured("head_offset", ("H",), "rand")),
    _score("pt_trig", _T + "_trig",
           "    return torch.sin(torch.cos(score)) + torch.tan(b)\n"),
    _score("pt_trig2", _T + "_trig2",
           "    c = torch.cos(score)\n"
           "    s = torch.sin(score)\n"
           "    return c * s + torch.tan(b)\n"),
    _score("pt_hop_head_add", "pytorch torch/testing/_internal/hop_db.py: sample_inputs_flex_attention score_mod",
           "    return score + h\n"),
    _score("pt_windowed", "pytorch test/inductor/test_flex_decoding.py: _generate_windowed (offset 8)",
           "    return torch.where(q_idx + 8 >= kv_idx, score, float('-inf'))\n"),
    # ------------------------------------------------------------------ PyTorch: score_mods of individual tests
    _score("pt_doc_causal_score", _T + "test_doc_mask_sparse: document_masking_causal",
           "    causal = q_idx >= kv_idx\n"
           "    same_doc = document_id[q_idx] == document_id[kv_idx]\n"
           "    return torch.where(causal & same_doc, score, -float('inf'))\n",
           Captured("document_id", (_NL,), "doc", "int32")),
    _score("pt_index_multiple", _T + "test_index_multiple",
           "    return score + bias[b][q_idx]\n",
           Captured("bias", ("B", "L"), "randn")),
    _score("pt_index_weird1", _T + "test_index_weird1",
           "    return score + bias[0][b, h][q_idx]\n",
           Captured("bias", (4, "B", "H", "L"), "randn")),
    _score("pt_index_weird2", _T + "test_index_weird2 (a 0-dim captured index)",
           "    return score + bias[b][h][which_bias, q_idx]\n",
           Captured("bias", ("B", "H", 4, "L"), "randn"),
           Captured("which_bias", (), "randint:0:4", "int64")),
    _score("pt_skip_odd_keys", _T + "test_skip_odd_keys",
           "    return torch.where(kv_idx % 2 == 0, score, float('-inf'))\n"),
    _score("pt_composition", _T + "test_function_composition (score_mod_2 of score_mod_1)",
           "    shifted = score + (q_idx - kv_idx)\n"
           "    return torch.where(q_idx <= kv_idx, shifted, float('-inf'))\n"),
    _score("pt_all_dims_bias", _T + "test_captured_buffers_all_dims: all_bias (also test_max_autotune_with_captured)",
           "    score = score + tok_scale[q_idx]\n"
           "    score = score + batch_scale[b]\n"
           "    return score + head_scale[h]\n",
           Captured("head_scale", ("H",), "randn"),
           Captured("batch_scale", ("B",), "randn"),
           Captured("tok_scale", ("L",), "randn")),
    _score("pt_seq_masking", _T + "test_seq_masking: seq_mask_mod (a bool table)",
           "    return torch.where(seq_idx[q_idx] == seq_idx[kv_idx], score, float('-inf'))\n",
           Captured("seq_idx", (_NL,), "doc", "bool")),
    _score("pt_bias_2d", _T + "test_load_from_bias_seq_only",
           "    return score + bias[q_idx, kv_idx]\n",
           Captured("bias", ("L", "S"), "randn")),
    _score("pt_bias_4d", _T + "test_load_from_bias_head_seq_batch (also test_modular_indexing)",
           "    return score + bias[b, h, q_idx, kv_idx]\n",
           Captured("bias", ("B", "H", "L", "S"), "randn")),
    _score("pt_rel_table", _T + "test_load_rel_bias (table sized for 300 tokens)",
           "    return score + rel_bias[(q_idx - kv_idx) + 300]\n",
           Captured("rel_bias", (600,), "randn")),
    _score("pt_causal_bidirectional", _T + "test_dependent_causal_bidirectional",
           "    causal = q_idx >= kv_idx\n"
           "    n = num_bidirectional[b]\n"
           "    both_in_prefix = (q_idx <= n) & (kv_idx <= n)\n"
           "    return torch.where(both_in_prefix | causal, score, -float('inf'))\n",
           Captured("num_bidirectional", ("B",), "randint:0:S", "int32")),
    _score("pt_natten_2d", _T + "test_natten_2d (true division as in the test; W 8, window 3)",
           "    q_x, q_y = q_idx / 8, q_idx % 8\n"
           "    kv_x, kv_y = kv_idx / 8, kv_idx % 8\n"
           "    near = ((q_x - kv_x).abs() <= 3) | ((q_y - kv_y).abs() <= 3)\n"
           "    return torch.where(near, score, float('-inf'))\n"),
    _score("pt_floor_divide", _T + "test_subgraph_respect_decompostion: score_mod_func",
           "    return score - q_idx // (1 + kv_idx)\n"),
    _score("pt_silu", _T + "test_silu_on_score",
           "    return torch.nn.functional.silu(score)\n"),
    _score("pt_padded_dense_causal", _T + "test_padded_dense_causal: njt_score_mod around _causal (seq_len = arange(B) + 1)",
           "    inner = torch.where(q_idx >= kv_idx, score, float('-inf'))\n"
           "    return torch.where(score <= seq_len[b] + 1, inner, -float('inf'))\n",
           Captured("seq_len", ("B",), "arange", "int32")),
    _score("pt_captured_scale", _T + "test_captured_scale (an unindexed 0-dim int tensor)",
           "    return score + scale\n",
           Captured("scale", (), "randint:1:3", "int32")),
    _score("pt_njt_causal", _T + "test_njt_causal: njt_score_mod around _causal",
           "    q_nested = q_idx - offsets[seq_idx[q_idx]]\n"
           "    kv_nested = kv_idx - offsets[seq_idx[kv_idx]]\n"
           "    return torch.where(q_nested >= kv_nested, score, float('-inf'))\n",
           Captured("seq_idx", (_NL,), "doc", "int32"),
           Captured("offsets", (5,), "randint:0:" + _NL, "int32")),
    _score("pt_new_zeros_bias", _T + "test_new_empty_mask_mod: score_mod (adds a bool table)",
           "    h0 = h.new_zeros(h.shape)\n"
           "    return score + attn_mask[b, h0, q_idx, kv_idx]\n",
           Captured("attn_mask", ("B", 1, "L", "S"), "bool", "bool")),
    _score("pt_euclidean", _T + "test_reduction_unrolled: euclidean_dist_pos_embed (length scales shifted to [1, 2) like its logspace)",
           "    q_pos = means[q_idx]\n"
           "    k_pos = means[kv_idx]\n"
           "    dist = (q_pos - k_pos).pow(2).sum(-1).sqrt()\n"
           "    scale = length_scales[h] + 1.0\n"
           "    return torch.exp(-dist / scale) * score\n",
           Captured("means", (_NL, 3), "randn"),
           Captured("length_scales", ("H",), "rand")),
    _score("pt_mul_buffer", _T + "test_non_divisible_with_captured_buffer: apply_multiplicative_bias",
           "    return score * multiplier[q_idx]\n",
           Captured("multiplier", ("L",), "randn")),
    # ------------------------------------------------------------------ PyTorch: learnable biases
    _score("pt_head_bias_learned", _T + "test_head_bias_req_grad: head_bias",
           "    return score + bias[h]\n",
           Captured("bias", ("H",), "randn", learned=True)),
    _score("pt_rel_pos_1d_learned", _T + "test_comparison_vs_sdpa_with_learnable_bias: rel_pos_1d",
           "    return score + bias[q_idx + kv_idx]\n",
           Captured("bias", ("L+S",), "randn", learned=True)),
    _score("pt_rel_pos_2d_chain", _T + "test_comparison_vs_sdpa_with_learnable_bias: rel_pos_2d (index multiple; frozen here: eager flex's backward of a learned bias[q][kv] fails when L != S)",
           "    return score + bias[q_idx][kv_idx]\n",
           Captured("bias", ("L", "S"), "randn")),
    _score("pt_rel_pos_2d_t_learned", _T + "test_comparison_vs_sdpa_with_learnable_bias: rel_pos_2d_transposed (also TestLearnableBiases.test_flipped_indexed_bias)",
           "    return score + bias[kv_idx, q_idx]\n",
           Captured("bias", ("S", "L"), "randn", learned=True)),
    _score("pt_rel_pos_3d_t_learned", _T + "test_comparison_vs_sdpa_with_learnable_bias: rel_pos_3d_transposed",
           "    return score + bias[h, kv_idx, q_idx]\n",
           Captured("bias", ("H", "S", "L"), "randn", learned=True)),
    _score("pt_relative_1d_learned", _T + "TestLearnableBiases.test_relative_1d_bias (also test_relative_1d_bias_only_grad)",
           "    return score + bias[torch.abs(q_idx - kv_idx)]\n",
           Captured("bias", (_NL,), "randn", learned=True)),
    _score("pt_head_specific_learned", _T + "TestLearnableBiases.test_head_specific_bias",
           "    return score + bias[h, q_idx, kv_idx]\n",
           Captured("bias", ("H", "L", "S"), "randn", learned=True)),
    _score("pt_batch_head_learned", _T + "TestLearnableBiases.test_batch_head_bias",
           "    return score + bias[b, h, q_idx, kv_idx]\n",
           Captured("bias", ("B", "H", "L", "S"), "randn", learned=True)),
    _score("pt_multiplicative_learned", _T + "TestLearnableBiases.test_multiplicative_bias",
           "    return score * bias[q_idx]\n",
           Captured("bias", ("L",), "randn", learned=True)),
    _score("pt_local_window_learned", _T + "TestLearnableBiases.test_local_window_bias (window 8)",
           "    w = torch.clamp(q_idx - kv_idx + 8, 0, 2 * 8)\n"
           "    return score + bias[w]\n",
           Captured("bias", (17,), "randn", learned=True)),
    _score("pt_global_tokens_learned", _T + "TestLearnableBiases.test_global_tokens_bias",
           "    return score + bias[kv_idx]\n",
           Captured("bias", ("S",), "randn", learned=True)),
    _score("pt_weird_learned", _T + "TestLearnableBiases.test_weird_bias",
           "    return score + bias[b, h, which_bias, q_idx]\n",
           Captured("bias", ("B", "H", 4, "L"), "randn", learned=True),
           Captured("which_bias", (), "randint:0:4", "int64")),
    _score("pt_indirect_learned", _T + "TestLearnableBiases.test_indirect_bias",
           "    return score + bias[offset[q_idx]]\n",
           Captured("bias", ("L",), "randn", learned=True),
           Captured("offset", ("L",), "randint:0:L", "int64")),
    _score("pt_symmetric_learned", _T + "TestLearnableBiases.test_symmetric_bias (one learned table gathered twice)",
           "    return score + bias[q_idx] + bias[kv_idx]\n",
           Captured("bias", (_NL,), "randn", learned=True)),
    _score("pt_head_gate_learned", _T + "TestLearnableBiases.test_head_specific_gate",
           "    return score * torch.sigmoid(gate_score[h].to(torch.float32))\n",
           Captured("gate_score", ("H",), "randn", learned=True)),
    _score("pt_distinct_learned", _T + "TestLearnableBiases.test_distinct_biases (also test_causal_block_non_divisible_with_captured_buffer, frozen)",
           "    return score + bias1[q_idx] + bias2[kv_idx]\n",
           Captured("bias1", ("L",), "randn", learned=True),
           Captured("bias2", ("S",), "randn", learned=True)),
    # ------------------------------------------------------------------ PyTorch: mask_mods
    _mask("pt_causal_mask", _T + "_causal_mask (also attention-gym attn_gym/masks/causal.py: causal_mask)",
          "    return q_idx >= kv_idx\n"),
    _mask("pt_inverse_causal_mask", _T + "_inverse_causal_mask",
          "    return q_idx <= kv_idx\n"),
    _mask("pt_doc_batched", _T + "test_document_masking_edge_case: mask_mod (per-batch document ids)",
          "    return document_masks[b, q_idx] == document_masks[b, kv_idx]\n",
          Captured("document_masks", ("B", _NL), "doc", "int32")),
    _mask("pt_rows_masked", _T + "test_fully_masked_out_rows (M 20)",
          "    return q_idx < 20\n"),
    _mask("pt_block_table", _T + "test_block_mask_non_divisible (seq = arange // 16)",
          "    return seq[q_idx] // 16 == seq[kv_idx] // 16\n",
          Captured("seq", (_NL,), "arange", "int64")),
    _mask("pt_batch_flip_causal", _T + "test_free_symbol_dynamic: batch_flip_causal",
          "    return (q_idx >= kv_idx) & (b % 2 == 0)\n"),
    _mask("pt_rand_rows", _T + "test_free_symbol_dynamic: lambda ~rand_mask[b, q_idx]",
          "    return ~rand_mask[b, q_idx]\n",
          Captured("rand_mask", ("B", "L"), "bool", "bool")),
    _mask("pt_input_lengths", _T + "test_dynamic_shapes_bug_dynamic_batch: _flex_attention_mask",
          "    n = input_lengths[b]\n"
          "    return (q_idx < n) & (kv_idx < n)\n",
          Captured("input_lengths", ("B",), "randint:0:L", "int64")),
    _mask("pt_sliding_causal", _T + "test_mask_mod_combiners: and_masks(causal_mask, sliding_window) (window 16; also test_lse_masked_output: sliding_window_causal, attention-gym attn_gym/masks/sliding_window.py: generate_sliding_window)",
          "    return (q_idx >= kv_idx) & ((q_idx - kv_idx) <= 16)\n"),
    _mask("pt_empty_mask", _T + "test_mask_mod_combiners: and_masks(causal_mask, neg_causal_mask) (masks everything)",
          "    return (q_idx >= kv_idx) & (q_idx < kv_idx)\n"),
    _mask("pt_causal_slide_upper", _T + "test_multiple_mask_calls: causal_mask_slidewindow_mod (window 16)",
          "    return (q_idx >= kv_idx) & (q_idx <= kv_idx + 16)\n"),
    _mask("pt_global_causal", _T + "test_lse_masked_output: global_causal (window 16)",
          "    return (q_idx >= kv_idx) & (q_idx - kv_idx > 16)\n"),
    _mask("pt_kv_bands", _T + "_test_block_mask_reuse_with_weird_mask: mask (256 -> 8, 2048 -> 40)",
          "    return (kv_idx < 8) | (kv_idx >= 40)\n"),
    _mask("pt_doc_causal_table", _T + "TestBlockMask.test_compiling_create_block_mask (also attention-gym examples/flex_attn.ipynb: document_causal_mask)",
          "    return (q_idx >= kv_idx) & (seq[q_idx] == seq[kv_idx])\n",
          Captured("seq", (_NL,), "doc", "int32")),
    _mask("pt_doc_clamped", _T + "TestBlockMask.test_doc_mask_clamped_repro: doc_mask_mod (ids shorter than S, indices clamped)",
          "    last = doc_ids.shape[0] - 1\n"
          "    return doc_ids[q_idx.clamp(0, last)] == doc_ids[kv_idx.clamp(0, last)]\n",
          Captured("doc_ids", ("L",), "doc", "int32")),
    _mask("pt_new_zeros_mask", _T + "test_new_empty_mask_mod: causal (a dense bool mask gathered)",
          "    h0 = h.new_zeros(h.shape)\n"
          "    return attn_mask[b, h0, q_idx, kv_idx]\n",
          Captured("attn_mask", ("B", 1, "L", "S"), "bool", "bool")),
    _mask("pt_causal_offset", _T + "TestBlockMask.test_block_mask_attributes: causal_mask with a float offset[b] (128 -> 16)",
          "    return (q_idx + (offset[b] * 16)) >= kv_idx\n",
          Captured("offset", ("B",), "arange", "float32")),
    # ------------------------------------------------------------------ attention-gym: score_mods
    _score("gym_alibi_table", _G + "examples/flex_attn.ipynb: alibi_and_causal_closure (per-head slopes captured)",
           "    return score + alibi_bias[h] * (kv_idx - q_idx)\n",
           Captured("alibi_bias", ("H",), "rand")),
    _score("gym_softcap", _G + "attn_gym/mods/softcapping.py: generate_tanh_softcap(30) (approx=True is the same math)",
           "    return 30 * torch.tanh(score / 30)\n"),
    _score("gym_softcap_2", _G + "examples/flex_attn.ipynb: tanh_soft_cap (cap 2; torch.tanh for the inline-PTX tanh)",
           "    score = score / 2\n"
           "    score = torch.tanh(score)\n"
           "    return score * 2\n"),
    _score("gym_activation_gelu", _G + "attn_gym/mods/activation.py: generate_activation_score_mod(F.gelu, offset 1.0)",
           "    return torch.log(torch.nn.functional.gelu(score) + 1.0)\n"),
    _score("gym_activation_relu", _G + "attn_gym/mods/activation.py: generate_activation_score_mod(F.relu, offset 1.0)",
           "    return torch.log(torch.nn.functional.relu(score) + 1.0)\n"),
    _score("gym_graphormer_spatial", _G + "attn_gym/mods/graphormer.py: generate_graphormer_spatial_bias (max_distance 5)",
           "    return score + spatial_bias[h, distances[b, q_idx, kv_idx]]\n",
           Captured("spatial_bias", ("H", 7), "randn", learned=True),
           Captured("distances", ("B", "L", "S"), "randint:0:7", "int32")),
    _score("gym_graphormer_edge", _G + "attn_gym/mods/graphormer.py: generate_graphormer_edge_bias (2 path positions, 3 edge types)",
           "    length = path_lengths[b, q_idx, kv_idx]\n"
           "    total = 0.0\n"
           "    total = total + torch.where(length > 0, edge_table0[h, path_types[b, q_idx, kv_idx, 0]], 0.0)\n"
           "    total = total + torch.where(length > 1, edge_table1[h, path_types[b, q_idx, kv_idx, 1]], 0.0)\n"
           "    return score + total / torch.clamp(length, min=1)\n",
           Captured("edge_table0", ("H", 3), "randn", learned=True),
           Captured("edge_table1", ("H", 3), "randn", learned=True),
           Captured("path_types", ("B", "L", "S", 2), "randint:0:3", "int32"),
           Captured("path_lengths", ("B", "L", "S"), "randint:0:3", "int32")),
    _score("gym_mla_rope", _G + "attn_gym/mods/latent_attention.py: generate_mla_rope_score_mod (num_heads 128, scale 1.0, rope dim 8)",
           "    return score + 1.0 * torch.dot(query_rope[b, h, q_idx], key_rope[b, h // 128, kv_idx])\n",
           Captured("query_rope", ("B", "H", "L", 8), "randn"),
           Captured("key_rope", ("B", 1, "S", 8), "randn")),
    _score("gym_sandwich", _G + "attn_gym/mods/sandwich.py: generate_sandwich_bias (max_seq_len 300: offset 299, table padded to 600)",
           "    return score + rel_bias[q_idx - kv_idx + 299] * head_scale[h]\n",
           Captured("rel_bias", (600,), "randn"),
           Captured("head_scale", ("H",), "rand")),
    # ------------------------------------------------------------------ attention-gym: mask_mods
    _mask("gym_prefix_lm", _G + "attn_gym/masks/prefix_lm.py: generate_prefix_lm_mask (prefix 20)",
          "    return (kv_idx < 20) | (q_idx >= kv_idx)\n"),
    _mask("gym_document_causal", _G + "attn_gym/masks/document_mask.py: generate_doc_mask_mod(causal_mask, offsets) (also examples/flex_attn.ipynb: create_njt_wrapper)",
          "    same_doc = document_id[q_idx] == document_id[kv_idx]\n"
          "    q_logical = q_idx - offsets[document_id[q_idx]]\n"
          "    kv_logical = kv_idx - offsets[document_id[kv_idx]]\n"
          "    return same_doc & (q_logical >= kv_logical)\n",
          Captured("document_id", (_NL,), "doc", "int32"),
          Captured("offsets", (5,), "randint:0:" + _NL, "int32")),
    _mask("gym_packed_doc_causal", _G + "attn_gym/masks/document_mask.py: generate_packed_causal_doc_mask_mod",
          "    doc_start = offsets[document_id[q_idx]]\n"
          "    return (kv_idx >= doc_start) & (q_idx >= kv_idx)\n",
          Captured("document_id", (_NL,), "doc", "int32"),
          Captured("offsets", (5,), "randint:0:" + _NL, "int32")),
    _mask("gym_shared_prefix", _G + "attn_gym/masks/shared_prefix.py: generate_shared_prefix_mask_mod",
          "    doc = document_id[q_idx]\n"
          "    pre = prefix_document_id[doc]\n"
          "    own = (kv_idx >= offsets[doc]) & (q_idx >= kv_idx)\n"
          "    in_prefix = (doc != pre) & (kv_idx >= offsets[pre]) & (kv_idx < offsets[pre + 1])\n"
          "    return own | in_prefix\n",
          Captured("document_id", (_NL,), "doc", "int32"),
          Captured("offsets", (5,), "randint:0:" + _NL, "int32"),
          Captured("prefix_document_id", (4,), "randint:0:4", "int32")),
    _mask("gym_dilated_window", _G + "attn_gym/masks/dilated_sliding_window.py: generate_dilated_sliding_window (window 8, dilation 2)",
          "    diff = torch.abs(q_idx - kv_idx)\n"
          "    return (diff <= 8) & (diff % 2 == 0)\n"),
    _mask("gym_natten", _G + "attn_gym/masks/natten.py: generate_natten (canvas 16x16, kernel 5x3)",
          "    q_x, q_y = q_idx // 16, q_idx % 16\n"
          "    kv_x, kv_y = kv_idx // 16, kv_idx % 16\n"
          "    cx = q_x.clamp(5 // 2, (16 - 1) - 5 // 2)\n"
          "    cy = q_y.clamp(3 // 2, (16 - 1) - 3 // 2)\n"
          "    return ((cx - kv_x).abs() <= 5 // 2) & ((cy - kv_y).abs() <= 3 // 2)\n"),
    _mask("gym_tiled_natten", _G + "attn_gym/masks/natten.py: generate_tiled_natten (canvas 16x16, kernel 5x5, tile 4x4)",
          "    def xy(i):\n"
          "        tile = i // 16\n"
          "        t_y, t_x = tile // 4, tile % 4\n"
          "        inner = i % 16\n"
          "        return t_x * 4 + inner % 4, t_y * 4 + inner // 4\n"
          "    q_x, q_y = xy(q_idx)\n"
          "    kv_x, kv_y = xy(kv_idx)\n"
          "    cx = q_x.clamp(2, 15 - 2)\n"
          "    cy = q_y.clamp(2, 15 - 2)\n"
          "    return ((cx - kv_x).abs() <= 2) & ((cy - kv_y).abs() <= 2)\n"),
    _mask("gym_morton_natten", _G + "attn_gym/masks/natten.py: generate_morton_natten (canvas 16x16, kernel 3x3; bit de-interleaving)",
          "    def compact(c):\n"
          "        c = c & 0x55555555\n"
          "        c = (c | (c >> 1)) & 0x33333333\n"
          "        c = (c | (c >> 2)) & 0x0F0F0F0F\n"
          "        c = (c | (c >> 4)) & 0x00FF00FF\n"
          "        return (c | (c >> 8)) & 0x0000FFFF\n"
          "    q_x, q_y = compact(q_idx), compact(q_idx >> 1)\n"
          "    kv_x, kv_y = compact(kv_idx), compact(kv_idx >> 1)\n"
          "    cx = q_x.clamp(1, 15 - 1)\n"
          "    cy = q_y.clamp(1, 15 - 1)\n"
          "    return ((cx - kv_x).abs() <= 1) & ((cy - kv_y).abs() <= 1)\n"),
    _mask("gym_sasa", _G + "examples/flex_attn.ipynb: sasa_mask (grid width 16, window 2)",
          "    q_x, q_y = q_idx // 16, q_idx % 16\n"
          "    kv_x, kv_y = kv_idx // 16, kv_idx % 16\n"
          "    return ((q_x - kv_x).abs() <= 2) & ((q_y - kv_y).abs() <= 2)\n"),
    _mask("gym_batchify_causal", _G + "attn_gym/masks/batchify.py: batchify_mask_mod(causal_mask, 8)",
          "    same = q_idx // 8 == kv_idx // 8\n"
          "    return same & ((q_idx % 8) >= (kv_idx % 8))\n"),
    _mask("gym_block_diagonal", _G + "attn_gym/masks/batchify.py: batchify_mask_mod(noop_mask, 4)",
          "    return q_idx // 4 == kv_idx // 4\n"),
    _mask("gym_block_diffusion", _G + "attn_gym/masks/block_diffusion.py: generate_block_diffusion_mask (seq_len 64, block 16)",
          "    q_noised = q_idx < 64\n"
          "    kv_noised = kv_idx < 64\n"
          "    q_block = (q_idx % 64) // 16\n"
          "    kv_block = (kv_idx % 64) // 16\n"
          "    diagonal = (q_block == kv_block) & (q_noised == kv_noised)\n"
          "    offset_causal = (q_block > kv_block) & q_noised & ~kv_noised\n"
          "    clean_causal = (q_block >= kv_block) & ~q_noised & ~kv_noised\n"
          "    return diagonal | offset_causal | clean_causal\n"),
    _mask("gym_flamingo", _G + "attn_gym/masks/flamingo.py: generate_vision_cross_attention_mask_mod (4 images)",
          "    interval = intervals[image_boundaries[kv_idx]]\n"
          "    return (q_idx >= interval[0]) & (q_idx < interval[1])\n",
          Captured("image_boundaries", ("S",), "doc", "int64"),
          Captured("intervals", (4, 2), "randint:0:L+1", "int64")),
    _mask("gym_global_window", _G + "attn_gym/masks/global_sliding_window.py: generate_global_sliding_window (window 3)",
          "    local = (q_idx - kv_idx).abs() <= 3\n"
          "    return local | is_global[q_idx] | is_global[kv_idx]\n",
          Captured("is_global", (_NL,), "bool", "bool")),
    _mask("gym_jetspec_tree", _G + "attn_gym/masks/jetspec.py: generate_jetspec_tree_causal_mask_mod (prefix 20, 16 tree nodes)",
          "    tree_idx = (kv_idx - 20).clamp(min=0, max=16 - 1)\n"
          "    visible = (kv_idx >= 20) & (kv_idx < 20 + 16)\n"
          "    return (kv_idx < 20) | (visible & ancestor_matrix[q_idx, tree_idx])\n",
          Captured("ancestor_matrix", ("L", 16), "bool", "bool")),
    _mask("gym_jetspec_training", _G + "attn_gym/masks/jetspec.py: generate_jetspec_training_mask_mod (prefix 20, block 8)",
          "    q_block, q_off = q_idx // 8, q_idx % 8\n"
          "    rel = kv_idx - 20\n"
          "    kv_block, kv_off = rel // 8, rel % 8\n"
          "    own = (kv_idx >= 20) & (q_block == kv_block) & (kv_off <= q_off)\n"
          "    return (kv_idx < 20) | own\n"),
    _mask("gym_sta_2d", _G + "attn_gym/masks/sta.py: generate_sta_mask_mod_2d (canvas 12x16, kernel 8x8, tile 4x4, text 32)",
          "    vision = 12 * 16\n"
          "    q_tile, kv_tile = q_idx // 16, kv_idx // 16\n"
          "    q_th, q_tw = q_tile // 4, q_tile % 4\n"
          "    kv_th, kv_tw = kv_tile // 4, kv_tile % 4\n"
          "    ch = q_th.clamp(1, (3 - 1) - 0)\n"
          "    cw = q_tw.clamp(1, (4 - 1) - 0)\n"
          "    h_ok = (kv_th >= ch - 1) & (kv_th <= ch + 0)\n"
          "    w_ok = (kv_tw >= cw - 1) & (kv_tw <= cw + 0)\n"
          "    both_vision = (q_idx < vision) & (kv_idx < vision)\n"
          "    to_text = (q_idx < vision) & (kv_idx >= vision) & (kv_idx < vision + 32)\n"
          "    from_text = (q_idx >= vision) & (kv_idx < vision + 32)\n"
          "    return (both_vision & h_ok & w_ok) | to_text | from_text\n"),
    _mask("gym_sta_3d", _G + "attn_gym/masks/sta.py: generate_sta_mask_mod_3d (canvas 4x8x8, kernel 2x4x6, tile 2x2x2, text 16)",
          "    vision = 4 * 8 * 8\n"
          "    def thw(i):\n"
          "        tile = i // 8\n"
          "        return tile // 16, (tile % 16) // 4, tile % 4\n"
          "    q_t, q_h, q_w = thw(q_idx)\n"
          "    kv_t, kv_h, kv_w = thw(kv_idx)\n"
          "    ct = q_t.clamp(0, 1 - 0)\n"
          "    ch = q_h.clamp(1, 3 - 0)\n"
          "    cw = q_w.clamp(1, 3 - 1)\n"
          "    t_ok = (kv_t >= ct - 0) & (kv_t <= ct + 0)\n"
          "    h_ok = (kv_h >= ch - 1) & (kv_h <= ch + 0)\n"
          "    w_ok = (kv_w >= cw - 1) & (kv_w <= cw + 1)\n"
          "    both_vision = (q_idx < vision) & (kv_idx < vision)\n"
          "    to_text = (q_idx < vision) & (kv_idx >= vision) & (kv_idx < vision + 16)\n"
          "    from_text = (q_idx >= vision) & (kv_idx < vision + 16)\n"
          "    return (both_vision & t_ok & w_ok & h_ok) | to_text | from_text\n"),
    _mask("gym_svg_spatial", _G + "attn_gym/masks/svg.py: generate_spatial_head_mask_mod (prompt 2, 14 tokens/frame, width 2, sink, round 4)",
          "    first_row = q_idx < 2\n"
          "    first_col = kv_idx < (2 + 14)\n"
          "    width = (2 * 14) // 4 * 4\n"
          "    return first_col | first_row | (torch.abs(q_idx - kv_idx) < width)\n"),
    _mask("gym_svg_temporal", _G + "attn_gym/masks/svg.py: generate_temporal_head_mask_mod (prompt 2, 10 frames, 14 tokens/frame, width 2)",
          "    first_row = q_idx < 2\n"
          "    first_col = kv_idx < 2\n"
          "    width = (2 * 14) // 10\n"
          "    q_tok = (q_idx - 2) % 14\n"
          "    kv_tok = (kv_idx - 2) % 14\n"
          "    return first_col | first_row | (torch.abs(q_tok - kv_tok) < width)\n"),
    _mask("gym_vsa_topk", _G + "attn_gym/masks/vsa.py: generate_vsa_mask_mod (tile 16, top-2, with partial-tile sizes)",
          "    q_tile = q_idx // 16\n"
          "    kv_tile = kv_idx // 16\n"
          "    chosen = topk_indices[b, h, q_tile]\n"
          "    selected = (chosen == kv_tile.unsqueeze(-1)).any(dim=-1)\n"
          "    return selected & (kv_idx % 16 < variable_block_sizes[kv_tile])\n",
          Captured("topk_indices", ("B", "H", "L", 2), "randint:0:S//16+1", "int32"),
          Captured("variable_block_sizes", ("S",), "randint:1:17", "int32")),
    _mask("gym_vsa_block_map", _G + "attn_gym/masks/vsa.py: generate_vsa_block_map_mask_mod (tile 16)",
          "    return block_map[b, h, q_idx // 16, kv_idx // 16]\n",
          Captured("block_map", ("B", "H", "L", "S"), "bool", "bool")),
    _mask("gym_first_row_block", _G + "examples/rows_guaranteed_safe_demo.py: subtle_mask_mod (block 128 -> 16)",
          "    first_row = q_idx == 0\n"
          "    not_first_kv_block = kv_idx >= 16\n"
          "    return torch.where(first_row & ~not_first_kv_block, False, True)\n"),
)


# --------------------------------------------------------------------------- building and running

_DTYPES = {"float32": torch.float32, "float64": torch.float64, "int64": torch.int64,
           "int32": torch.int32, "bool": torch.bool}


def _size(x, sizes: dict) -> int:
    if isinstance(x, int):
        return x
    return int(eval(str(x), {"__builtins__": {"max": max, "min": min}}, dict(sizes)))  # noqa: S307


def _make(cap: Captured, sizes: dict, generator: torch.Generator) -> torch.Tensor:
    shape = tuple(max(1, _size(d, sizes)) for d in cap.shape)
    make = cap.make
    if make == "randn":
        t = torch.randn(shape, generator=generator)
    elif make == "rand":
        t = torch.rand(shape, generator=generator)
    elif make.startswith("randint:"):
        _, lo, hi = make.split(":")
        lo, hi = _size(lo, sizes), _size(hi, sizes)
        t = torch.randint(lo, max(hi, lo + 1), shape, generator=generator)
    elif make == "doc":
        t = torch.randint(0, 4, shape, generator=generator).sort(dim=-1).values
    elif make == "arange":
        t = torch.arange(shape[-1]).expand(shape).clone()
    elif make == "bool":
        t = torch.rand(shape, generator=generator) < 0.5
    else:
        raise ValueError(f"unknown make {make!r} of {cap.name}")
    return t.to(_DTYPES[cap.dtype])


def build_globals(peer: Peer, B: int, H: int, HKV: int, L: int, S: int, generator: torch.Generator,
                  *, learned_grad: bool = True) -> dict:
    """{"torch", "math", and each Captured of ``peer`` as a CPU tensor}; floating tensors of
    ``learned`` captures require grad unless ``learned_grad`` is False."""
    sizes = {"B": B, "H": H, "HKV": HKV, "L": L, "S": S}
    out: dict = {"torch": torch, "math": math}
    for cap in peer.captured:
        t = _make(cap, sizes, generator)
        if cap.learned and learned_grad and t.is_floating_point():
            t.requires_grad_(True)
        out[cap.name] = t
    return out


def make_fn(peer: Peer, globals_dict: dict):
    """Exec ``peer.code`` in ``globals_dict`` and return its score_mod / mask_mod."""
    exec(compile(peer.code, f"<peer {peer.name}>", "exec"), globals_dict)  # noqa: S102
    return globals_dict["score_mod" if peer.kind == "score" else "mask_mod"]
