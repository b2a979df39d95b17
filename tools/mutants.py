"""Mutation testing: one-line changes to te_compile that would make an answer silently wrong, each with the tests that
must catch it.

Each mutant names a file, an exact snippet of it (found exactly once), its replacement and the test selection that
must fail with it. The script copies the checkout (its tracked and untracked, not ignored files) to a temporary folder,
first runs every selection there unmutated (each must pass), then applies one mutant at a time to that copy and runs
its selection with pytest (``-x -q -p no:cacheprovider``). A mutant is killed when its selection fails. The checkout
itself is never written to; the copy is removed at the end, also on Ctrl-C.

    python -m tools.mutants                 # every mutant (make mutants)
    python -m tools.mutants --list          # the list
    python -m tools.mutants blockmask_full  # some of them, by name
    python -m tools.mutants --jobs 2        # two pytest runs at once, each on its own copy

Exit status 0 only when every selection passes unmutated, every snippet is found once and every mutant is killed:
a snippet that no longer matches (the code moved) fails the run until the list follows the code.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Optional


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # relative to the repository root
    original: str  # exact text, found exactly once in the file
    replacement: str
    tests: tuple  # pytest arguments: files or node ids, maybe -k EXPR
    why: str  # the wrong answer it would give


def _k(path: str, expr: str) -> tuple:
    return (path, "-k", expr)


MUTANTS = [
    # ---- the BlockMask check (te_compile/runtime/blockmask.py) and the materialized mask's block semantics
    Mutant("blockmask_full", "te_compile/runtime/blockmask.py",
           "(listed_full.expand(shape) != want_full.expand(shape)).any()])", "listed.new_zeros(())])",
           _k("tests/test_flex.py", "edited_full_blocks_is_refused"),
           "a BlockMask with a full block dropped, moved or added is served element-wise"),
    Mutant("blockmask_partial", "te_compile/runtime/blockmask.py",
           "[(listed.expand(shape) != want_partial.expand(shape)).any(),", "[listed.new_zeros(()),",
           _k("tests/test_flex.py", "different_block_mask_at_run_time or hand_built_block_mask_is_kept"),
           "a BlockMask with partial blocks dropped is served element-wise"),
    Mutant("blockmask_answer_ignored", "te_compile/runtime/blockmask.py",
           "        why = self.check.finish()", "        why = self.check.finish() and None",
           _k("tests/test_flex.py", "begun_answers_when_finished"),
           "the op's BlockMask check, read after the attention is queued, lets an edited BlockMask through"),
    Mutant("blockmask_chunk_offset", "te_compile/runtime/blockmask.py",
           "torch.arange(r0, r0 + rows, dtype=torch.int32", "torch.arange(0, rows, dtype=torch.int32",
           _k("tests/test_flex.py", "few_blocks_at_a_time"),
           "the check's query chunks all read rows from 0: a BlockMask is judged against the wrong rows"),
    Mutant("blockmask_key_no_mask_inputs", "te_compile/runtime/blockmask.py",
           "return tuple(range(spec.n_inputs, n_extra)) + tuple(used)", "return tuple(range(spec.n_inputs, n_extra))",
           _k("tests/test_flex.py", "keyed_by_what_the_mask_reads"),
           "a BlockMask checked once stays trusted after the document ids its mask_mod reads are edited in place"),
    Mutant("blockmask_padding_kept", "te_compile/runtime/blockmask.py",
           "(0, pad_k, 0, pad_q)).bool()", "(0, pad_k, 0, pad_q), value=1).bool()",
           _k("tests/test_flex.py", "test_flex_matches_eager and none-causal"),
           "padding past the sequence end counted as attended: create_block_mask's own BlockMasks refused"),
    Mutant("materialized_mask_full_blocks", "te_compile/passes/inserted.py",
           "            keep = keep | per_element(full_num, full_idx)", "            keep = keep",
           _k("tests/test_flex.py", "document_mask_follows_edited_full_blocks"),
           "a document mask ignores the BlockMask's full blocks"),
    Mutant("materialized_mask_partial_blocks", "te_compile/passes/inserted.py",
           "        keep = keep & per_element(kv_num, kv_idx)", "        keep = keep",
           _k("tests/test_flex.py", "document_mask_follows_a_hand_built_block_mask"),
           "a document mask ignores which partial blocks the BlockMask lists"),
    # ---- ALiBi on cuDNN's native form (te_compile/lowering/alibi.py, lowering.builtin_alibi)
    Mutant("alibi_slope_rtol", "te_compile/lowering/alibi.py", "SLOPE_RTOL = 1e-6", "SLOPE_RTOL = 1e-2",
           _k("tests/test_alibi.py", "near_miss"),
           "slopes 0.5% off cuDNN's served by built-in ALiBi, which uses cuDNN's slopes"),
    Mutant("alibi_strict_causal", "te_compile/lowering/alibi.py", '(mask.op == "ge" and mask.args == (_Q, _KV))',
           '(mask.op in ("ge", "gt") and mask.args == (_Q, _KV))',
           _k("tests/test_alibi.py", "heads_for_checks_the_slope_values"),
           "strictly causal (q > kv) served as built-in ALiBi + causal (the diagonal attended)"),
    Mutant("alibi_distance_sign", "te_compile/lowering/alibi.py",
           "    if e.op == \"sub\" and e.args == (_Q, _KV):\n        return -1",
           "    if e.op == \"sub\" and e.args == (_Q, _KV):\n        return 1",
           _k("tests/test_alibi.py", "not_alibi"),
           "slope * (q - kv) (the opposite sign) taken for ALiBi"),
    Mutant("alibi_lengths", "te_compile/lowering/lower.py", "lengths[0] == lengths[1] > 0", "lengths[0] > 0",
           _k("tests/test_alibi.py", "lowering_uses_builtin_alibi_only_where_exact"),
           "built-in ALiBi at L != S, where cuDNN's alignment differs from flex's"),
    # ---- the band detection (te_compile/lowering/lower.py)
    Mutant("band_gt", "te_compile/lowering/lower.py", "        return (t + 1, None)", "        return (t, None)",
           _k("tests/test_cudnn_decisions.py", "builtin_band_recognition"),
           "q - kv > t read as >= t: one diagonal too many attended"),
    Mutant("band_lt", "te_compile/lowering/lower.py", "    return (None, t - 1)  # lt", "    return (None, t)  # lt",
           _k("tests/test_cudnn_decisions.py", "builtin_band_recognition"),
           "a window's strict bound read as inclusive"),
    Mutant("band_and", "te_compile/lowering/lower.py",
           "        return (max(los) if los else None, min(his) if his else None)",
           "        return (min(los) if los else None, max(his) if his else None)",
           _k("tests/test_cudnn_decisions.py", "builtin_band_recognition"),
           "the intersection of two bands taken as their hull"),
    # ---- the prefix-LM split and its lse merge (te_compile/lowering/prefix.py)
    Mutant("prefix_merge_weight", "te_compile/lowering/prefix.py", "    w_b = torch.exp(lse_b - merged).unsqueeze(-1)",
           "    w_b = torch.exp(lse_b - tail_a).unsqueeze(-1)", ("tests/test_prefix.py",),
           "the causal half's weight in the merge"),
    Mutant("prefix_merge_lse", "te_compile/lowering/prefix.py", "    lse[:, :, P:] = merged", "    lse[:, :, P:] = tail_a",
           ("tests/test_prefix.py",), "the merged lse (and every gradient computed from it)"),
    Mutant("prefix_dlse_dropped", "te_compile/lowering/prefix.py",
           "    tail = (dlse[:, :, P:].contiguous(),) if dlse is not None else (None,)", "    tail = (None,)",
           ("tests/test_prefix.py",), "lse's gradient dropped in the causal half's backward"),
    Mutant("prefix_le_spelling", "te_compile/lowering/prefix.py", '{"lt": t, "le": t + 1}', '{"lt": t, "le": t}',
           _k("tests/test_cudnn_decisions.py", "prefix_split_recognition"),
           "kv <= P - 1 split at P - 1 keys"),
    Mutant("prefix_causal_only", "te_compile/lowering/prefix.py", "diagonal_bounds(causal_side) != (0, None)",
           "diagonal_bounds(causal_side)[0] != 0",
           _k("tests/test_prefix.py", "another_band"),
           "a prefix + sliding window split as prefix + causal (the window lost)"),
    # ---- the GQA map and the reference math (te_compile/reference.py)
    Mutant("gqa_expand", "te_compile/reference.py", "    return t.repeat_interleave(hq // hk, dim=1)",
           "    return t.repeat(1, hq // hk, 1, 1)", _k("tests/test_reference.py", "gqa_causal_2kv"),
           "query head h reads kv head h % Hkv instead of h // (Hq // Hkv)"),
    Mutant("gqa_reduce", "te_compile/reference.py",
           "    return g.reshape(B, hk, hq // hk, *g.shape[2:]).sum(dim=2)",
           "    return g.reshape(B, hq // hk, hk, *g.shape[2:]).sum(dim=1)",
           _k("tests/test_reference.py", "gqa_causal_2kv"),
           "dK / dV summed over the wrong query heads"),
    Mutant("dlse_sign", "te_compile/reference.py", "delta = delta - dlse", "delta = delta + dlse",
           _k("tests/test_flex.py", "test_flex_matches_eager and softcap-none"),
           "the gradient of lse enters dS with the wrong sign"),
    Mutant("causal_alignment", "te_compile/reference.py",
           "keep = torch.ones(L, S, dtype=torch.bool, device=s.device).tril()",
           "keep = torch.ones(L, S, dtype=torch.bool, device=s.device).tril(S - L)",
           _k("tests/test_reference.py", "cross_causal"), "is_causal bottom-right aligned (SDPA's is top-left)"),
    # ---- the op's backward (te_compile/runtime/ops.py)
    Mutant("op_dlse_dropped", "te_compile/runtime/ops.py", "ctx.spec, need_dbias, dlse)", "ctx.spec, need_dbias, None)",
           _k("tests/test_ops.py", "dlse_match_dense"), "lse's gradient dropped by the op"),
    Mutant("op_dbias_dropped", "te_compile/runtime/ops.py", "        need_dbias = bias is not None and bool(nig[_BIAS])",
           "        need_dbias = False", _k("tests/test_dbias.py", "bias_grad_matches_eager"),
           "a learned bias gets no gradient"),
    Mutant("op_captured_grads", "te_compile/runtime/ops.py", "        if any(nig[_EXTRA:]):", "        if False:",
           _k("tests/test_ops.py", "captured_tensor_grads_are_refused"),
           "captured score_mod tensors that need a gradient silently get none"),
    # ---- dBias inference (te_compile/passes/grad.py, passes/flex.py)
    Mutant("pass_dbias", "te_compile/passes/grad.py",
           "    bias = bool(enabled and mask is not None and mask.dtype != torch.bool and _rg(site.attn_mask))",
           "    bias = False", _k("tests/test_dbias.py", "pass_reads_dbias"),
           "the pass plans no dBias for a learned bias (cuDNN checked without the dBias plan)"),
    Mutant("flex_learned_table_fp32", "te_compile/passes/flex.py", '{"float32": True} if ins.bias_float32 else {})', "{})",
           _k("tests/test_flex.py", "learned_tables_bias_stays_float32"),
           "a learned table's bias rounded to bf16 (its gradient drifts)"),
    # ---- exactness guards (te_compile/passes/flex.py, ir.py, passes/sdpa.py)
    Mutant("guard_nan_under_gathering_mask", "te_compile/passes/flex.py",
           "    if mask_gather is not None and ir.may_be_nan(score):", "    if False:",
           _k("tests/test_fuzz_classes.py", "nan_score_under_gathering_mask"),
           "a score_mod that may be NaN under a -inf bias: NaN where flex's mask hides it"),
    Mutant("may_be_nan_division", "te_compile/score/ir.py",
           'if e.op in ("div", "rem", "floordiv") and "score" in e.args[1].leaves():',
           'if e.op in ("rem", "floordiv") and "score" in e.args[1].leaves():',
           _k("tests/test_flex.py", "may_be_nan"), "1 / score taken as never NaN"),
    Mutant("sdpa_dropout", "te_compile/passes/sdpa.py", "    if site.dropout_p > 0:", "    if False:",
           _k("tests/test_rewrite.py", "dropout_is_kept"), "SDPA with dropout served without it"),
    Mutant("sdpa_mask_and_causal", "te_compile/passes/sdpa.py", "    if site.attn_mask is not None and site.is_causal:",
           "    if False:", _k("tests/test_rewrite.py", "mask_with_is_causal_is_kept"),
           "attn_mask with is_causal served where torch's own backends disagree"),
    Mutant("guard_cudnn_dbias_derivative", "te_compile/passes/flex.py",
           "    if impl == \"cudnn\" and need_dbias and t.score != _SCORE and not ir.derivative(t.score).is_const(1.0):",
           "    if False:", _k("tests/test_cudnn_decisions.py", "dbias_with_a_non_unit_derivative"),
           "cuDNN's dBias under softcap taken as flex's table gradient (0.9-1.0 off)"),
    Mutant("fold_negative_scale", "te_compile/passes/flex.py",
           "    if isinstance(scale, numbers.Number) and scale < 0:", "    if False:",
           _k("tests/test_flex.py", "linear_score_mod_folds_into_the_scale"),
           "a negative softmax scale handed to cuDNN (inf at ragged lengths)"),
    Mutant("affine_any_cast", "te_compile/score/ir.py", '    if e.op == "cast" and e.dtype in _EXACT_FLOAT_CASTS:',
           '    if e.op == "cast":', _k("tests/test_fuzz_classes.py", "affinity_is_structural"),
           "score.to(int32) read as affine: its truncation folded into the scale"),
    Mutant("sdpa_negative_scale_causal", "te_compile/passes/sdpa.py",
           "    if scale is not None and scale < 0 and site.is_causal:", "    if False:",
           _k("tests/test_fuzz_classes.py", "negative_scale_with_is_causal"),
           "a causal SDPA call at a negative scale served where torch's kernels disagree"),
    Mutant("lse_log2", "te_compile/passes/flex.py", "(lse, _INV_LN2)", "(lse, 1.0)",
           _k("tests/test_flex.py", "lse_is_log2"), "flex's lse returned in the wrong log base"),
    # ---- the rule thresholds (te_compile/tuning/rules.py, passes/flex.py)
    Mutant("rule_min_tokens", "te_compile/tuning/rules.py", "    if need is not None and L >= need:",
           "    if need is not None and L > need:", ("tests/test_rules.py",),
           "a class served one size later than its rule says"),
    Mutant("rule_narrow_window", "te_compile/tuning/rules.py", "NARROW_WINDOW = 1024", "NARROW_WINDOW = 512",
           _k("tests/test_rules.py", "window"), "Mistral's 512-key windows served (measured slower)"),
    Mutant("rule_mask_as_a_bias", "te_compile/tuning/rules.py", "    if spec.empty_rows:  # a gathering mask_mod",
           "    if False:  # a gathering mask_mod", _k("tests/test_rules.py", "carried_as_a_bias"),
           "document ids the interval rule keeps served as a dense bias, classed as a site without a mask (0.77x)"),
    Mutant("rule_document_ids_served", "te_compile/tuning/rules.py",
           '"flex intervals, document ids": Rule(None, None,', '"flex intervals, document ids": Rule(4096, None,',
           _k("tests/test_rules.py", "document_ids_are_kept"),
           "document ids served from 4096 tokens: a new plan for every packing (one site 0.07-0.29x)"),
    Mutant("tune_document_ids_static", "te_compile/tuning/graph_ab.py",
           'fresh=ids if cls.startswith("flex intervals, document ids") else [])', "fresh=[])",
           _k("tests/test_graph_ab.py", "as_a_loader_gives_them"),
           "document ids measured on ids that never change: a measurement serves what a loader's new ids run 0.1x"),
    Mutant("gather_mask_density", "te_compile/passes/flex.py", "MIN_GATHER_MASK_DENSITY = 0.6",
           "MIN_GATHER_MASK_DENSITY = 0.0", _k("tests/test_flex.py", "sparse_document_mask_is_kept"),
           "sparse document masks served as a dense bias (slower than Inductor's block-sparse flex)"),
    Mutant("intervals_runs_flag", "te_compile/lowering/intervals.py",
           "self.valid = self.valid & (new.sum(dim=1) == distinct)", "self.valid = self.valid",
           _k("tests/test_intervals.py", "not_runs"),
           "document ids that come back later in their row trusted as runs: the interval kernels drop those keys"),
    Mutant("intervals_sweep", "te_compile/lowering/intervals.py", "            s = torch.maximum(st[i], prev)",
           "            s = st[i]", _k("tests/test_intervals.py", "named_masks or random_compositions"),
           "overlapping intervals not swept apart: endpoints decrease, keys counted twice or dropped"),
    Mutant("intervals_le", "te_compile/lowering/intervals.py", "            iv = [(zero, t + 1)]", "            iv = [(zero, t)]",
           _k("tests/test_intervals.py", "named_masks"), "`kv <= t` read as `kv < t`: the diagonal key dropped"),
    Mutant("wide_bias_masked", "te_compile/passes/flex.py",
           "    return t.bias_term is not None and (need_dbias or t.mask_gather is not None or not t.mask.is_const(True))",
           "    return t.bias_term is not None and need_dbias", _k("tests/test_flex.py", "under_a_mask_keeps_its_precision"),
           "a gathered bias under a mask rounded to bf16 after a shift by a hidden key: visible entries lose the softmax's precision"),
    Mutant("intervals_cache_offset", "te_compile/lowering/intervals.py", "            anchor = anchor + self.rows(q_off)",
           "            anchor = anchor", _k("tests/test_intervals.py", "hugging_face"),
           "Hugging Face's cache position dropped from a packed-sequence mask: each row reads another row's document"),
    Mutant("interval_plan_version", "te_compile/cudnn/flexkernel.py",
           "key += tuple((b.data_ptr(), b._version, b.shape, b.stride(), b.dtype) for b in bufs)",
           "key += tuple((b.data_ptr(), b.shape, b.stride(), b.dtype) for b in bufs)",
           _k("tests/test_flex_intervals.py", "plans_are_reused"),
           "a plan reused after the document ids were written in place: the old documents' intervals"),
    Mutant("flexlaunch_zero", "te_compile/cudnn/flexlaunch.py", "        return t.zero_() if self.zero else t",
           "        return t", _k("tests/test_flexlaunch.py", "replay_computes"),
           "a replayed launch's accumulating workspace (dK / dV accumulators, the tile counter) left unzeroed"),
    Mutant("native_interval_again", "te_compile/cudnn/flexkernel.py", "                data=list(last.inputs), again=bool(last.inputs))",
           "                data=list(last.inputs), again=False)",
           _k("tests/test_flexlaunch.py", "native_call_path_gets_a_call"),
           "C++ holds the launches of the first document ids only: every later packing runs on Python"),
    Mutant("native_interval_copied_operand", "te_compile/cudnn/flexkernel.py",
           "    elif any(_usable(t) is not t for t in last.operands):", "    elif False:",
           _k("tests/test_flexlaunch.py", "native_call_path_gets_a_call"),
           "C++ given launches recorded on a dense copy of a broadcast operand: it passes the operand's own strides"),
    Mutant("rules_intervals_from_python", "te_compile/tuning/rules.py",
           '    if cls == "flex intervals" and not native.possible() and deciding_for_device() is None:',
           "    if False:",
           _k("tests/test_rules.py", "native_call_path_only"),
           "static interval masks served from 128 tokens without the native call path: launches from Python are "
           "host-bound there"),
    Mutant("native_bias_rows", "te_compile/cudnn/runners.py",
           "        return _native_info(self.launch, rows=self.rows, bias_rows=self.bias_rows)",
           "        return _native_info(self.launch, rows=self.rows)",
           _k("tests/test_runners.py", "hands_cpp_its_row_fill"),
           "C++ leaves the rows a -inf bias masks entirely with cuDNN's output instead of 0 and lse -inf"),
    Mutant("native_lse_guard", "te_compile/cudnn/runners.py",
           "        return _native_info(self.launch, guard=self.guard)", "        return _native_info(self.launch)",
           _k("tests/test_runners.py", "hands_cpp_its_row_fill"),
           "C++ runs cuDNN's backward on lse -inf rows: NaN gradients where eager gives 0"),
    Mutant("intervals_bands_stay", "te_compile/passes/flex.py", "    if not ir.buffers_used(mask) and _builtin_band(mask):",
           "    if False:", _k("tests/test_flex_intervals.py", "bands_stay"),
           "bands moved off the graph path's built-in band (the kernels that skip their tiles as well)"),
    Mutant("intervals_score_mod", "te_compile/passes/flex.py",
           "    if score != _SCORE or mask.is_const(True) or mods.learned", "    if mask.is_const(True) or mods.learned",
           _k("tests/test_flex_intervals.py", "score_mod_keeps"),
           "a score_mod dropped: the interval kernels compute plain softmax attention"),
]


def _root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _copy_tree(root: str, dest: str) -> None:
    """The checkout's tracked and untracked (not ignored) files, as they are now, into ``dest``."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for f in files:
        src = os.path.join(root, f)
        if not f or not os.path.isfile(src):
            continue  # a deleted tracked file, or a submodule
        os.makedirs(os.path.dirname(os.path.join(dest, f)), exist_ok=True)
        shutil.copy2(src, os.path.join(dest, f))


def _pytest(tree: str, args: tuple, timeout: float) -> tuple[str, float]:
    """("pass" | "fail" | "timeout" | "error: ...", seconds) of pytest on ``args`` in ``tree``."""
    env = dict(os.environ, PYTHONPATH=tree, PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m", "not cuda", *args]
    t0 = time.perf_counter()
    try:
        r = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", time.perf_counter() - t0
    dt = time.perf_counter() - t0
    if r.returncode == 0:
        return "pass", dt
    if r.returncode == 1:
        return "fail", dt
    tail = (r.stdout + r.stderr).strip().splitlines()[-1:] or [""]
    return f"error: pytest exit code {r.returncode} ({tail[0][:200]})", dt


def _check_snippets(tree: str, mutants: list[Mutant]) -> list[str]:
    problems = []
    for m in mutants:
        path = os.path.join(tree, m.path)
        text = open(path).read() if os.path.exists(path) else ""
        n = text.count(m.original)
        if n != 1:
            problems.append(f"{m.name}: the snippet is found {n} times in {m.path} (expected once): {m.original!r}")
    return problems


def _mutated(tree: str, m: Mutant, timeout: float) -> tuple[str, float]:
    """Apply ``m`` to the copy ``tree``, run its selection, put the file back."""
    path = os.path.join(tree, m.path)
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(text.replace(m.original, m.replacement, 1))
    try:
        return _pytest(tree, m.tests, timeout)
    finally:
        with open(path, "w") as f:
            f.write(text)


def run(mutants: list[Mutant], timeout: float, jobs: int = 1, out=sys.stdout) -> int:
    """Run the baseline and the mutants on ``jobs`` copies of the checkout; 0 when every mutant is killed."""
    from concurrent.futures import ThreadPoolExecutor
    import queue

    trees = [tempfile.mkdtemp(prefix="te_compile-mutants-") for _ in range(max(1, jobs))]
    free: "queue.Queue[str]" = queue.Queue()
    try:
        for t in trees:
            _copy_tree(_root(), t)
            free.put(t)
        problems = _check_snippets(trees[0], mutants)
        for p in problems:
            print(f"STALE    {p}", file=out, flush=True)
        stale = {p.split(":")[0] for p in problems}

        def on_a_copy(work):
            tree = free.get()
            try:
                return work(tree)
            finally:
                free.put(tree)

        # every selection passes on the unmutated tree (one pytest run per distinct selection)
        selections = list(dict.fromkeys(m.tests for m in mutants))
        broken = set()
        with ThreadPoolExecutor(len(trees)) as pool:
            for sel, (status, dt) in zip(selections, pool.map(
                    lambda sel: on_a_copy(lambda tree: _pytest(tree, sel, timeout)), selections)):
                if status != "pass":
                    broken.add(sel)
                    print(f"BASELINE {status}: {' '.join(sel)} ({dt:.0f} s) fails without a mutant", file=out,
                          flush=True)
        print(f"baseline: {len(selections) - len(broken)} of {len(selections)} selections pass unmutated",
              file=out, flush=True)
        todo = [m for m in mutants if m.name not in stale and m.tests not in broken]
        killed = survived = 0
        with ThreadPoolExecutor(len(trees)) as pool:
            for m, (status, dt) in zip(todo, pool.map(
                    lambda m: on_a_copy(lambda tree: _mutated(tree, m, timeout)), todo)):
                if status in ("fail", "timeout"):
                    killed += 1
                    print(f"killed   {m.name:34s} {dt:5.0f} s  {m.path}", file=out, flush=True)
                else:
                    survived += 1
                    print(f"SURVIVED {m.name:34s} {dt:5.0f} s  {m.path}: {status}; {m.why}; tests: "
                          f"{' '.join(m.tests)}", file=out, flush=True)
        total = len(mutants)
        print(f"mutants: {killed} of {total} killed ({100 * killed / total:.0f}%), {survived} survived, "
              f"{len(stale)} stale, {total - killed - survived - len(stale)} not run (their selection fails "
              "unmutated)", file=out, flush=True)
        return 0 if killed == total else 1
    finally:
        for t in trees:
            shutil.rmtree(t, ignore_errors=True)


def markdown(mutants: list[Mutant]) -> str:
    """The list as a Markdown table (docs/contributing.md)."""
    rows = ["| mutant | file | the wrong answer it would give | killed by |", "|---|---|---|---|"]
    for m in mutants:
        tests = shlex.join(m.tests).replace("|", "\\|")
        rows.append(f"| `{m.name}` | `{m.path}` | {m.why} | `{tests}` |")
    return "\n".join(rows)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.mutants", description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*", help="run only these mutants (default: all)")
    p.add_argument("--list", action="store_true", help="print the mutants and exit")
    p.add_argument("--markdown", action="store_true", help="print the list as a Markdown table and exit")
    p.add_argument("--timeout", type=float, default=600, help="seconds per pytest run (a timeout counts as killed)")
    p.add_argument("--jobs", type=int, default=1, help="pytest runs at once, each on its own copy of the checkout")
    a = p.parse_args(argv)
    names = {m.name for m in MUTANTS}
    if len(names) != len(MUTANTS):
        p.error("two mutants share a name")
    unknown = set(a.names) - names
    if unknown:
        p.error(f"no mutant named {', '.join(sorted(unknown))} (--list lists them)")
    chosen = [m for m in MUTANTS if not a.names or m.name in a.names]
    if a.markdown:
        print(markdown(chosen))
        return 0
    if a.list:
        for m in chosen:
            print(f"{m.name:34s} {m.path}: {m.why}\n{'':34s} tests: {' '.join(m.tests)}")
        return 0
    try:
        return run(chosen, a.timeout, a.jobs)
    except KeyboardInterrupt:
        print("mutants: interrupted; the checkout was not modified", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
