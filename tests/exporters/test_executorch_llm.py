"""Target ``executorch_llm``: the runner-form bundle runs in ExecuTorch's own LLM runner (``TextLLMRunner``) and
reproduces eager fp32, at positions past the sliding window too; a bundle whose metadata disagrees is refused."""
import json
import shutil
from importlib import resources

import numpy as np
import pytest
import yaml

from omni_export.artifacts.store import Store
from omni_export.components.decoder_lm import reference_logits
from omni_export.errors import UnsupportedError
from omni_export.exporters import executorch_llm as etl
from omni_export.exporters import get_target
from omni_export.parity import gate
from omni_export.pipeline import Pipeline
from omni_export.recipes import parse_recipe


def small(small_ckpt, builds, components=("decode_step",), **over):
    """spark_executorch's thresholds over the two-layer checkpoint (window 8), context 32, with ``builds``."""
    d = yaml.safe_load(resources.files("omni_export.recipes").joinpath("spark_executorch.yaml").read_text())
    d.update(model={"family": "spark", "preset": None, "seed": 0, "checkpoint": str(small_ckpt)}, context=32,
             prompts={**d["prompts"], "max_prompt_tokens": 12}, parity={"new_tokens": 12}, builds=builds,
             components=list(components), **over)
    return parse_recipe(d, "spark_executorch (two-layer test checkpoint)")


@pytest.fixture(scope="module")
def run(small_ckpt, tmp_path_factory):
    root = tmp_path_factory.mktemp("etl")
    p = Pipeline(small(small_ckpt, [{"target": "executorch_llm", "scheme": "fp32"}]), Store(root))
    return p, p.run(), root


def _art(run):
    (a,) = run[1].artifacts
    return a


def test_runner_bundle_passes_the_gate_with_every_figure_from_its_runtimes(run):
    p, res, root = run
    a = _art(run)
    assert a.status == gate.PASS, a.reasons
    shelf = root / "published" / p.recipe.name / a.artifact_id
    assert {f.name for f in shelf.iterdir()} == {"model.pte", "tokenizer.json", "manifest.json"}
    m = json.loads((shelf / "manifest.json").read_text())
    assert "TextLLMRunner" in m["parity"]["runtime"] and "executorch-runtime" in m["parity"]["runtime"]
    runtimes = m["artifact"]["export"]["parity_runtimes"]
    assert "TextLLMRunner" in runtimes["free-running greedy ids"]
    assert "executorch.runtime" in runtimes["teacher-forced logits"]
    lm = a.parity["lm"]
    assert a.parity["generator"]["refused"] is None
    assert lm["greedy_agreement"] == 1.0 and lm["greedy_ids"] == lm["fp32_greedy_ids"]  # ids from TextLLMRunner
    assert a.parity["outputs"]["logits"]["snr_db"] >= 100 and lm["top1_agreement"] == 1.0
    # the K/V rows never leave the program: their threshold is recorded as skipped, with why
    kv = [c for c in a.checks if c["status"] == gate.SKIPPED]
    assert kv and all("inside the program" in c["skipped"] for c in kv)
    assert m["parity"]["asked_steps"] == a.parity["steps"]  # steps asked = steps measured
    tok = json.loads((shelf / "tokenizer.json").read_text())
    assert tok["model"]["type"] == "BPE" and tok["added_tokens"]


def test_positions_past_the_sliding_window_match_the_uncached_reference(run):
    """Prefill of 10 tokens in one call, then one token a call to position 30 (window 8, context 32): every row's
    logits against ``reference_logits`` (full attention with the window mask, no cache)."""
    import torch
    from executorch.runtime import Runtime

    p, res, root = run
    a = _art(run)
    lm = p.bundle.module
    toks = [1] + list(range(40, 70))
    ref = reference_logits(lm, toks)
    method = Runtime.get().load_program(root / "published" / p.recipe.name / a.artifact_id / "model.pte") \
        .load_method("forward")
    got = {9: method.execute([torch.tensor([toks[:10]]), torch.tensor([0])])[0].numpy().reshape(-1)}
    for pos in range(10, len(toks)):
        got[pos] = method.execute([torch.tensor([[toks[pos]]]), torch.tensor([pos])])[0].numpy().reshape(-1)
    assert p.bundle.config.sliding_window == 8 and max(got) > 3 * 8
    for pos, row in got.items():
        np.testing.assert_allclose(row, ref[pos], rtol=0, atol=2e-4 * np.abs(ref[pos]).max())


def test_a_bundle_whose_metadata_disagrees_is_refused_before_the_runner(run, tmp_path):
    """A runner handed get_max_seq_len larger than the program takes would feed a prompt the program cannot hold;
    the gate checks the program's own constant methods against its forward and the export record."""
    p, res, root = run
    a = _art(run)
    shelf = root / "published" / p.recipe.name / a.artifact_id
    info = json.loads((shelf / "manifest.json").read_text())["artifact"]["export"]
    assert etl.bundle_problems(shelf, info) == []
    bad = dict(info, context=info["context"] * 2, eos_ids=[7])
    problems = etl.bundle_problems(shelf, bad)
    assert any("get_max_context_len" in s for s in problems) and any("get_eos_ids" in s for s in problems)

    # a program lowered with get_max_seq_len above what its forward takes (a stand-in program with the runner's IO)
    import torch

    from omni_export.components.decoder_runner import runner_metadata
    from omni_export.schemes import get_scheme

    class Stand(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.head = torch.nn.Embedding(info["vocab"], 8), torch.nn.Linear(8, info["vocab"])

        def forward(self, tokens, input_pos):
            return self.head(self.emb(tokens)[:, -1:] + input_pos.float())

    comp = p.components["decode_step"]
    d = tmp_path / "bad"
    d.mkdir()
    meta = dict(runner_metadata(comp, 31, info["eos_ids"]), get_n_layers=info["layers"])
    etl.write_program(Stand(), meta, 15, get_scheme("fp32"), d / etl.PROGRAM)
    shutil.copy(shelf / etl.TOKENIZER, d / etl.TOKENIZER)
    problems = etl.bundle_problems(d, info)
    assert problems == ["get_max_seq_len = 31, the program's forward takes at most 15 tokens"]
    out = etl.runner_generate(d, info, comp.tokenizer, [[1, 40, 41]], [4])
    assert out["ids"] == [[]] and "get_max_seq_len = 31" in out["refused"]


def test_a_component_the_target_cannot_serve_is_one_line_before_any_export(small_ckpt, tmp_path):
    r = small(small_ckpt, [{"target": "executorch_llm", "scheme": "fp32", "components": ["prefill"]}],
              components=("decode_step", "prefill"), options={"prefill": {"rows": 4}})
    with pytest.raises(UnsupportedError, match="component prefill is not a decoder LM's decode_step"):
        Pipeline(r, Store(tmp_path)).run()
    with pytest.raises(Exception, match="does not support scheme fp16"):
        Pipeline(small(small_ckpt, [{"target": "executorch_llm", "scheme": "fp16"}]), Store(tmp_path)).check()
    assert get_target("executorch_llm").schemes == ("fp32", "w8a8_dynamic")


def test_views_of_the_dynamic_row_count_infer_it_so_xnnpack_takes_them(run):
    """XNNPACK's partitioner refuses a reshape whose target shape names the symbolic row count (each cuts the runner
    program into one more delegate); ``inferred_views`` rewrites a single such size to -1 and the program computes
    the same."""
    import torch

    from omni_export.components.decoder_runner import runner_module
    from omni_export.schemes import get_scheme

    p = run[0]
    module = runner_module(p.components["decode_step"], get_scheme("fp32"))
    example = (torch.tensor([[1, 2]]), torch.tensor([0]))
    dims = ({1: torch.export.Dim.DYNAMIC(min=1, max=16)}, {})
    views = (torch.ops.aten.view.default, torch.ops.aten.reshape.default, torch.ops.aten._unsafe_view.default)

    def symbolic_views(prog):
        return [n for n in prog.graph_module.graph.nodes if n.op == "call_function" and n.target in views
                and any(not isinstance(d, int) for d in n.args[1])]

    with torch.no_grad():
        prog = torch.export.export(module, example, dynamic_shapes=dims)
        before = len(symbolic_views(prog))
        assert before > 0  # the form as traced: views that name the row count
        toks, pos = torch.tensor([[5, 6, 7, 8, 9]]), torch.tensor([0])
        want = prog.module()(toks, pos)
        n = etl.inferred_views(prog)
        left = symbolic_views(prog)  # what stays names two symbolic sizes (e.g. heads x rows): not inferable
        assert n > 0 and n + len(left) == before
        assert all(sum(not isinstance(d, int) for d in v.args[1]) > 1 for v in left)
        again = prog.module()
        for name, buf in again.named_buffers():  # empty caches for the second run (the RoPE tables stay)
            if "_cache_" in name:
                buf.zero_()
        got = again(toks, pos)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def _kernel_calls(pte) -> dict[str, int]:
    """How many times the program's ``forward`` calls each operator outside its delegates, and the delegate calls."""
    from collections import Counter

    from executorch.exir._serialize._program import deserialize_pte_binary

    plan = deserialize_pte_binary(pte.read_bytes()).program.execution_plan[0]
    kinds = [type(i.instr_args).__name__ for i in plan.chains[0].instructions]
    calls = Counter(plan.operators[i.instr_args.op_index].name for i, k in
                    zip(plan.chains[0].instructions, kinds) if k == "KernelCall")
    return {**calls, "delegates": kinds.count("DelegateCall")}


def test_each_cache_is_written_in_place_and_attended_by_executorch_llm_kernels(run):
    """A functional cache write (``index_put`` of the whole buffer and a ``copy_`` back) copies every cache on every
    call; the program writes each layer's new K and V rows in place (``llama::update_cache``) and attends with
    ``llama::custom_sdpa``, as ``export_llama``'s program does, and the runner's metadata says so."""
    p, res, root = run
    a = _art(run)
    shelf = root / "published" / p.recipe.name / a.artifact_id
    calls = _kernel_calls(shelf / "model.pte")
    L = p.bundle.config.num_hidden_layers
    assert calls["llama::update_cache"] == 2 * L and calls["llama::custom_sdpa"] == L
    assert not any(op.startswith(("aten::index_put", "aten::copy_", "aten::cat")) for op in calls)
    info = json.loads((shelf / "manifest.json").read_text())["artifact"]["export"]
    assert info["metadata"]["use_sdpa_with_kv_cache"] is True
    assert "[1, 32, n_kv, head_dim]" in info["io"]["cache"]


def test_a_chunk_past_the_window_and_a_new_sequence_over_stale_caches_match_the_reference(run):
    """A multi-row call that starts past the sliding window (the window mask over the whole cache, from input_pos),
    then a second, shorter sequence from position 0 over the first one's cache rows (the runner does not clear them:
    full layers read only up to the last new row, sliding layers mask the rest)."""
    import torch
    from executorch.runtime import Runtime

    p, res, root = run
    a = _art(run)
    lm = p.bundle.module
    method = Runtime.get().load_program(root / "published" / p.recipe.name / a.artifact_id / "model.pte") \
        .load_method("forward")
    W = p.bundle.config.sliding_window

    def call(toks, start):
        return method.execute([torch.tensor([toks]), torch.tensor([start])])[0].numpy().reshape(-1)

    first = [1] + list(range(100, 127))
    ref = reference_logits(lm, first)
    got = {W: call(first[:W + 1], 0)}                          # rows 0..W
    got[W + 6] = call(first[W + 1:W + 7], W + 1)              # rows W+1..W+6 in one call, past the window
    for pos in range(W + 7, len(first)):
        got[pos] = call([first[pos]], pos)
    second = [1] + list(range(200, 212))
    ref2 = reference_logits(lm, second)
    got2 = {4: call(second[:5], 0)}
    for pos in range(5, len(second)):
        got2[pos] = call([second[pos]], pos)
    for g, r in ((got, ref), (got2, ref2)):
        for pos, row in g.items():
            np.testing.assert_allclose(row, r[pos], rtol=0, atol=2e-4 * np.abs(r[pos]).max())


def test_concats_with_an_empty_input_are_dropped_and_the_program_computes_the_same(run):
    """Each runner-form layer is handed empty caches (``CacheAttention`` owns the real ones), so its concatenation of
    cache and new rows is a copy of the new rows; ``dropped_empty_concats`` removes those inputs."""
    import torch

    from omni_export.components.decoder_runner import runner_module
    from omni_export.schemes import get_scheme

    p = run[0]
    module = runner_module(p.components["decode_step"], get_scheme("fp32"))
    example = (torch.tensor([[1, 2]]), torch.tensor([0]))
    dims = ({1: torch.export.Dim.DYNAMIC(min=1, max=16)}, {})

    def empty_cats(prog):
        return [n for n in prog.graph_module.graph.nodes if n.op == "call_function"
                and n.target == torch.ops.aten.cat.default and any(etl._no_elements(x) for x in n.args[0])]

    with torch.no_grad():
        prog = torch.export.export(module, example, dynamic_shapes=dims)
        n_layers = p.bundle.config.num_hidden_layers
        assert len(empty_cats(prog)) == 2 * n_layers
        toks, pos = torch.tensor([[5, 6, 7]]), torch.tensor([0])
        want = prog.module()(toks, pos)
        assert etl.dropped_empty_concats(prog) == 2 * n_layers and not empty_cats(prog)
        got = prog.module()(toks, pos)  # rewrites the same cache rows from position 0: reads nothing else
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_the_runner_attention_rotates_exactly_as_layers_rotate_and_keeps_the_v_heads():
    """``RunnerAttention``'s RoPE (rotate-half as a constant signed permutation, over the stacked q/k/v heads) is
    ``layers.rotate`` bit for bit on the q and k heads and leaves the v heads as they are."""
    import torch

    from omni_export.components.decoder_runner import RunnerAttention
    from omni_export.blocks.layers import Attention, rope_inv_freq, rope_table, rotate

    nh, nkv, hd, S = 4, 2, 16, 5
    attn = RunnerAttention(Attention(32, nh, nkv, hd, 1e-6, qk_norm=False))
    assert attn.fused
    cos, sin = (torch.from_numpy(t)[None, :, None] for t in rope_table(rope_inv_freq(1e4, hd), np.arange(3, 3 + S)))
    x = torch.randn(1, S, nh + 2 * nkv, hd)
    got = attn.rotate(x, *attn.head_tables(cos, sin))
    want = rotate(x[:, :, :nh + nkv].transpose(1, 2), cos.transpose(1, 2), sin.transpose(1, 2), hd).transpose(1, 2)
    torch.testing.assert_close(got[:, :, :nh + nkv], want, rtol=0, atol=0)
    torch.testing.assert_close(got[:, :, nh + nkv:], x[:, :, nh + nkv:], rtol=0, atol=0)


@pytest.mark.slow  # a 4-layer llama lowered to XNNPACK
def test_a_llama_runner_program_is_one_delegate_a_layer_with_its_rope_and_norms_inside(tmp_path):
    """The tiny llama (SmolLM2's family): every norm is ``RMSNormAsLinear`` (a matmul of the dynamic rows would
    decompose to views naming the row count, outside XNNPACK) and every attention ``RunnerAttention`` (RoPE's
    rotate-half a constant ``linear``, not ``layers.rotate``'s half-slices; q/k/v one projection), so each layer is one
    delegate, between it and the LLM kernels only the slices of q, k and v by head, no view outside a delegate,
    the last layer's output projection and MLP on the last row only; the program reproduces the uncached reference
    over a prefill and steps, and the runner form's eager output equals the model's own layers'."""
    import torch
    from executorch.runtime import Runtime

    from omni_export.components.decoder_runner import RMSNormAsLinear, RunnerAttention, runner_metadata, runner_module
    from omni_export.families import build_model
    from omni_export.blocks.graph_forms import RMSNormAsMatMul
    from omni_export.schemes import get_scheme

    b = build_model("llama", "tiny", 0)
    comp = b.family.components["decode_step"](b, context=48)
    module = runner_module(comp, get_scheme("fp32"))
    norms = [m for m in module.modules() if isinstance(m, (RMSNormAsLinear, RMSNormAsMatMul))]
    L = b.config.num_hidden_layers
    assert len(norms) == 2 * L + 1 and all(isinstance(m, RMSNormAsLinear) for m in norms)
    assert sum(isinstance(m, RunnerAttention) and m.fused for m in module.modules()) == L
    x = torch.randn(1, 5, b.config.hidden_size)
    torch.testing.assert_close(norms[0](x), RMSNormAsMatMul(b.module.model.layers[0].input_layernorm)(x))
    assert not any(isinstance(m, (RMSNormAsLinear, RunnerAttention)) for m in b.module.modules())  # model untouched

    pte = tmp_path / etl.PROGRAM
    n = etl.write_program(module, runner_metadata(comp, 16, [2]), 16, get_scheme("fp32"), pte)
    calls = _kernel_calls(pte)
    # per layer one delegate; the final norm's and the head's; q/k/v by head (3 a layer), the last row of x and o
    assert calls["delegates"] == n <= L + 2
    assert calls["aten::slice_copy"] == 3 * L + 2
    assert calls["llama::update_cache"] == 2 * L and calls["llama::custom_sdpa"] == L
    assert "executorch_prim::et_view" not in calls and "aten::cat" not in calls
    toks = [1] + list(range(300, 330))
    ref = reference_logits(b.module, toks)
    method = Runtime.get().load_program(pte).load_method("forward")
    got = {11: method.execute([torch.tensor([toks[:12]]), torch.tensor([0])])[0].numpy().reshape(-1)}
    for pos in range(12, len(toks)):
        got[pos] = method.execute([torch.tensor([[toks[pos]]]), torch.tensor([pos])])[0].numpy().reshape(-1)
    for pos, row in got.items():
        np.testing.assert_allclose(row, ref[pos], rtol=0, atol=2e-4 * np.abs(ref[pos]).max())
    fresh = runner_module(comp, get_scheme("fp32"))  # eager: the runner form against the model's own step
    with torch.no_grad():
        eager = {11: fresh(torch.tensor([toks[:12]]), torch.tensor([0]))[0, -1].numpy()}
        for pos in range(12, len(toks)):
            eager[pos] = fresh(torch.tensor([[toks[pos]]]), torch.tensor([pos]))[0, -1].numpy()
    for pos, row in eager.items():
        np.testing.assert_allclose(row, ref[pos], rtol=0, atol=1e-5 * np.abs(ref[pos]).max())


def test_a_piece_several_ids_decode_to_is_resolved_by_the_programs_own_choice(run):
    """The runner hands out pieces, not ids; where several ids decode to one piece (Gemma 3's "." is one), the id is
    the runner's temperature-0 choice among them: the program driven as the runner drives it names it. A generated
    piece made ambiguous (its id and another share it) resolves to the runner's id, whichever order the candidates
    come in; a piece no id decodes to is -1, and the pieces after it that one id names keep their ids."""
    from omni_export.runtimes.llm_runner import forced_logits, pieces_to_ids

    p, res, root = run
    a = _art(run)
    shelf = root / "published" / p.recipe.name / a.artifact_id
    pte, vocab = shelf / etl.PROGRAM, json.loads((shelf / "manifest.json").read_text())["artifact"]["export"]["vocab"]
    prompt, got = [1, 40, 41, 42, 43], []
    for _ in range(3):  # the program's greedy ids, one token a call
        got.append(int(forced_logits(pte, [prompt + got])[0][-1, 0].argmax()))
    pieces, other = ["p0", "p1", "p2"], (got[1] + 1) % vocab
    named = {"p0": [got[0]], "p2": [got[2]]}
    for cands in ([got[1], other], [other, got[1]]):
        assert pieces_to_ids(pte, prompt, pieces, {**named, "p1": cands}) == got
    assert pieces_to_ids(pte, prompt, pieces, named) == [got[0], -1, got[2]]  # no id decodes to p1
    assert pieces_to_ids(pte.with_name("absent.pte"), prompt, pieces, {k: [i] for k, i in zip(pieces, got)}) == got
