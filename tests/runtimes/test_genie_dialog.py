"""The Genie binding (omni_export/runtimes/genie.py) on hand-made bundles: tiny graphs in Genie's IO (numpy weights,
tests/runtimes/genie_tiny.py), compiled to context binaries by onnxruntime-qnn for the SM8750 HTP and run by
libGenie.so on the HTP simulator."""
from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from genie_tiny import (QUANT_IO, Tiny, compile_io_quantized, greedy, ort_chain, probe_layout, probe_onnx, rope,
                        tiny_lm_onnx, write_tokenizer)
from omni_export.devices import get_device
from omni_export.runtimes import RuntimeUnavailable
from omni_export.runtimes.genie import GenieDialog, GenieError, genie_library, rename_context_graph, write_genie_config

try:
    genie_library()
    from omni_export.runtimes.ort import require_qnn
    require_qnn()
except RuntimeUnavailable as e:
    pytest.skip(f"no Genie here: {e}", allow_module_level=True)

DEVICE = get_device("galaxy_s25")
PROMPT, N_NEW = [1, 2, 3], 8


def compile_ctx(src, name: str) -> str:
    """``src`` compiled to a context binary next to it (fp16 HTP): the binary's file name."""
    from omni_export.runtimes.ort import htp_session
    htp_session(src, DEVICE, fp16=True, context_out=src.parent / f"{name}_ctx.onnx")
    return f"{name}_ctx_qnn.bin"


def bundle(d, cfg: Tiny, ctx_bins: list[str]):
    write_tokenizer(d, cfg.vocab)
    return write_genie_config(d, ctx_bins=ctx_bins, context=cfg.context, n_vocab=cfg.vocab, bos=-1, eos=-1, pad=0,
                              kv_dim=cfg.head_dim, pos_id_dim=cfg.pos_dim, rope_theta=cfg.rope_theta,
                              soc_model=DEVICE.soc_model, dsp_arch=f"v{DEVICE.htp_arch}")


@pytest.fixture(scope="module")
def tiny():
    cfg = Tiny()
    return cfg, cfg.make_weights()


@pytest.fixture(scope="module")
def ar1(tmp_path_factory, tiny):
    """An AR-1 bundle of the tiny LM: (config path, the graph's ONNX source)."""
    cfg, w = tiny
    d = tmp_path_factory.mktemp("ar1")
    src = tiny_lm_onnx(cfg, w, 1, d / "token_ar1_cl32.onnx")
    return bundle(d, cfg, [compile_ctx(src, "token_ar1_cl32")]), src


def test_token_query_is_numpy_argmax_chain(ar1, tiny):
    cfg, w = tiny
    want, rows = greedy(cfg, w, PROMPT, N_NEW)
    top2 = np.sort(rows, -1)[:, -2:]
    assert (top2[:, 1] - top2[:, 0]).min() > 0.05  # no near-tie fp16 could flip
    with GenieDialog(ar1[0]) as g:
        assert g.token_query(PROMPT, N_NEW) == want
        g.reset()
        assert g.token_query(PROMPT, N_NEW) == want  # reset starts over
        g.reset()
        assert g.token_query(PROMPT, 3) == want[:3]


def test_a_full_context_is_an_error_not_a_short_answer(ar1, tiny):
    cfg, _ = tiny
    prompt = list(range(1, 20))
    with GenieDialog(ar1[0]) as g:
        assert len(g.token_query(prompt, cfg.context - len(prompt))) == 13  # prompt + new ids = C
        g.reset()
        with pytest.raises(GenieError, match="Context Size was exceeded") as e:
            g.token_query(prompt, cfg.context - len(prompt) + 1)
        assert e.value.status == "WARNING_CONTEXT_EXCEEDED"


def test_logits_of_every_generated_position(ar1, tiny):
    cfg, w = tiny
    want_ids, want = ort_chain(cfg, ar1[1], PROMPT, N_NEW)  # the same graph on ORT CPU, driven as Genie drives it
    np.testing.assert_allclose(want, greedy(cfg, w, PROMPT, N_NEW)[1], atol=1e-4)
    with GenieDialog(ar1[0]) as g:
        ids, logits = g.token_query(PROMPT, N_NEW, logits=True)
        assert ids == want_ids and logits.shape == (N_NEW, cfg.vocab) and logits.dtype == np.float32
        np.testing.assert_allclose(logits, want, atol=0.1)  # fp16 HTP (measured max 0.03)
        assert (logits.argmax(-1) == ids).all()
        g.reset()
        assert g.token_query(PROMPT, N_NEW) == want_ids  # the bundle's own sampler is back


def test_query_uses_the_bundles_tokenizer(ar1, tiny):
    cfg, w = tiny
    want = "".join(f"t{i}" for i in greedy(cfg, w, PROMPT, N_NEW)[0])  # word-level vocab, WordPiece decoder
    with GenieDialog(ar1[0]) as g:
        assert g.query(" ".join(f"t{i}" for i in PROMPT), N_NEW) == want


def test_what_genie_feeds_an_ar1_graph(tmp_path):
    """Mask 0 / -1000 (own row in the last column), RoPE cos/sin from rope-theta, the row of position p at slot p."""
    cfg = Tiny(vocab=128)
    conf = bundle(tmp_path, cfg, [compile_ctx(probe_onnx(cfg, 1, tmp_path / "probe_ar1.onnx"), "probe_ar1")])
    at = probe_layout(cfg, 1)
    with GenieDialog(conf) as g:
        ids, rows = g.token_query(PROMPT, 3, logits=True)
    seq = PROMPT + ids
    C = cfg.context
    for j, row in enumerate(rows):
        p = len(PROMPT) - 1 + j  # the position whose logits these are
        mask = np.full(C, -1000.0)
        mask[:p] = 0
        mask[C - 1] = 0
        np.testing.assert_allclose(row[at["mask"]], mask, atol=1e-3)  # through fp16 HTP: -1000.00006
        cos, sin = rope(cfg, [p])
        np.testing.assert_allclose(row[at["cos"]], cos[0], atol=2e-3)
        np.testing.assert_allclose(row[at["sin"]], sin[0], atol=2e-3)
        np.testing.assert_allclose(row[at["key_slots"]][:p], 500 + np.array(seq[:p]), atol=1e-2)
        np.testing.assert_allclose(row[at["value_slots"]][:p], 1500 + np.array(seq[:p]), atol=1e-2)
        assert round(float(row[at["id"]][0])) == seq[p]


def test_what_genie_feeds_quantized_io(tmp_path):
    """uint16 mask: Genie writes the raw extremes (65535 visible, 0 masked), so an encoding with zero point 65535
    dequantizes them to 0 / -1000; uint16 cos/sin: quantized with the tensor's encoding; uint8 KV: the output bytes
    are copied to slot p, and a slot not yet written holds the byte 128 (whatever the zero point: 128 here)."""
    assert QUANT_IO["attention_mask"][1:] == (1000 / 65535, 65535) and QUANT_IO["kv"][1:] == (1.0, 0)
    cfg = Tiny(vocab=128)
    ctx = compile_io_quantized(probe_onnx(cfg, 1, tmp_path / "probe_q.onnx", quant=True), "probe_q", DEVICE)
    at = probe_layout(cfg, 1)
    with GenieDialog(bundle(tmp_path, cfg, [ctx])) as g:
        ids, rows = g.token_query(PROMPT, 2, logits=True)
    seq, C = PROMPT + ids, cfg.context
    for j, row in enumerate(rows):
        p = len(PROMPT) - 1 + j
        mask = np.full(C, -1000.0)
        mask[:p] = 0
        mask[C - 1] = 0
        np.testing.assert_allclose(row[at["mask"]], mask, atol=1e-3)
        cos, sin = rope(cfg, [p])
        np.testing.assert_allclose(row[at["cos"]], cos[0], atol=1e-3)
        np.testing.assert_allclose(row[at["value_slots"]][:p], 100 + np.array(seq[:p]), atol=1e-2)
        np.testing.assert_allclose(row[at["key_slots"]][:p], seq[:p], atol=1e-2)
        np.testing.assert_allclose(row[at["key_slots"]][p:], 128, atol=1e-2)


def test_prompt_runs_through_the_ar_n_graph(tmp_path, tiny):
    """ctx-bins [AR-4, AR-1]: the prompt goes through AR-4 (valid rows first, then pad rows), generation through
    AR-1; the ids are numpy's."""
    cfg, w = tiny
    prompt = [5, 9, 1, 7, 3, 2]
    bins = [compile_ctx(tiny_lm_onnx(cfg, w, ar, tmp_path / f"lm_ar{ar}.onnx"), f"lm_ar{ar}") for ar in (4, 1)]
    with GenieDialog(bundle(tmp_path, cfg, bins)) as g:
        assert g.token_query(prompt, N_NEW) == greedy(cfg, w, prompt, N_NEW)[0]

    pcfg = Tiny(vocab=128)
    bins = [compile_ctx(probe_onnx(pcfg, ar, tmp_path / f"probe_ar{ar}.onnx"), f"probe_ar{ar}") for ar in (4, 1)]
    with GenieDialog(bundle(tmp_path, pcfg, bins)) as g:
        _, rows = g.token_query(prompt, 2, logits=True)
    C = pcfg.context
    first = rows[0][probe_layout(pcfg, 4)["mask"]]  # 6 ids = AR-4 calls [5 9 1 7] and [3 2 pad pad]: row 1 of call 2
    want = np.full(C, -1000.0)
    want[:4] = 0
    want[C - 4:C - 2] = 0
    np.testing.assert_allclose(first, want, atol=1e-3)
    second = rows[1][probe_layout(pcfg, 1)["mask"]]  # the first generated id, through AR-1 at position 6
    want = np.full(C, -1000.0)
    want[:6] = 0
    want[C - 1] = 0
    np.testing.assert_allclose(second, want, atol=1e-3)


@pytest.mark.parametrize("ar", [16, 24])
def test_an_ar_n_of_half_the_context_scrambles_the_k_cache(tmp_path, tiny, ar):
    """AR-16 of C = 32: past_key_in [.., hd, C-N] and past_key_out [.., hd, N] have one shape, and Genie then writes
    the AR-N graph's K rows in a stride the AR-1 graph does not read (the prompt's rows scrambled: the ids leave
    numpy's after the first, which the AR-N graph computed). AR-24 (C-N = 8 = head_dim) is exact."""
    cfg, w = tiny
    prompt = [5, 9, 1, 7, 3, 2]
    bins = [compile_ctx(tiny_lm_onnx(cfg, w, a, tmp_path / f"lm_ar{a}.onnx"), f"lm_ar{a}") for a in (ar, 1)]
    want, rows = greedy(cfg, w, prompt, N_NEW)
    with GenieDialog(bundle(tmp_path, cfg, bins)) as g:
        ids, logits = g.token_query(prompt, N_NEW, logits=True)
    assert ids[0] == want[0] and np.abs(logits[0] - rows[0]).max() < 0.1  # the AR-N graph's own logits
    if ar == 16:
        assert ids != want and np.abs(logits[1] - rows[1]).max() > 1.0  # measured 3.4
    else:
        assert ids == want and np.abs(logits - rows).max() < 0.1  # measured 0.022


def test_parts_chain_by_tensor_name_once_named_k_of_n(tmp_path, tiny):
    cfg, w = tiny
    bins = [compile_ctx(tiny_lm_onnx(cfg, w, 1, tmp_path / f"lm_{k}.onnx", part=(k, 2)), f"lm_{k}") for k in (1, 2)]
    conf = bundle(tmp_path, cfg, bins)
    with pytest.raises(GenieError, match="Tensor not found") as e:  # ORT's graph names: each graph taken as a model
        GenieDialog(conf)
    assert "Error validating" in e.value.genie_message
    for k, b in enumerate(bins, 1):
        assert rename_context_graph(tmp_path / b, "token_ar1_cl32", k, 2).endswith(f"_{k}_of_2")
    conf = bundle(tmp_path, cfg, bins[::-1])  # listed in the wrong order: Genie orders by _k_of_n
    with GenieDialog(conf) as g:
        assert g.token_query(PROMPT, N_NEW) == greedy(cfg, w, PROMPT, N_NEW)[0]


def test_a_weight_shared_binary_kills_genie_on_the_simulator(tmp_path, tiny):
    """Measured: SIGSEGV in GenieDialog_create; the worker process turns it into a GenieError. onnxruntime-qnn's own
    load of the same binary on the simulator dies the same way: the crash is the simulator's context load."""
    import subprocess
    from omni_export.runtimes.ort import htp_session
    cfg, w = tiny
    srcs = []
    for ar in (4, 1):
        (tmp_path / f"ar{ar}").mkdir()
        srcs.append(tiny_lm_onnx(cfg, w, ar, tmp_path / f"ar{ar}" / "model.onnx"))
    for i, src in enumerate(srcs):
        share = {"ep.share_ep_contexts": "1"} | ({"ep.stop_share_ep_contexts": "1"} if i else {})
        htp_session(src, DEVICE, fp16=True, context_out=tmp_path / f"g{i}_ctx.onnx", config=share, root=tmp_path)
    with pytest.raises(GenieError) as e:
        GenieDialog(bundle(tmp_path, cfg, ["g0_ctx_qnn.bin"]))
    assert e.value.status == "the Genie process died (signal 11)"
    assert "create From Binary" in e.value.genie_message
    load = ("import sys; from omni_export.devices import get_device; from omni_export.runtimes.ort import htp_session; "
            "htp_session(sys.argv[1], get_device('galaxy_s25'), fp16=True)")
    done = subprocess.run([sys.executable, "-c", load, str(tmp_path / "g1_ctx.onnx")], capture_output=True, timeout=300)
    assert done.returncode == -11, done.stderr[-500:]


def _edited(conf, edit):
    c = json.loads(conf.read_text())
    edit(c["dialog"])
    path = conf.with_name("edited_genie_config.json")
    path.write_text(json.dumps(c))
    return path


def test_genie_refusals_carry_genies_text(ar1):
    conf = ar1[0]
    missing = _edited(conf, lambda d: d["engine"]["model"]["binary"].update({"ctx-bins": ["absent.bin"]}))
    with pytest.raises(GenieError, match="Can't access model file : absent.bin") as e:
        GenieDialog(missing)
    assert e.value.status == "ERROR_GENERAL"
    bigger = _edited(conf, lambda d: d["context"].update({"size": 64}))
    with pytest.raises(GenieError, match="Config specifies context->size=64, but loaded max-CL=32"):
        GenieDialog(bigger)
    unknown = _edited(conf, lambda d: d["context"].update({"colour": 1}))
    with pytest.raises(GenieError, match="additional property 'colour'") as e:
        GenieDialog(unknown)
    assert e.value.status == "ERROR_JSON_SCHEMA"


def test_a_mismatched_n_vocab_is_caught_by_the_logits_not_by_genie(ar1):
    """Genie takes an n-vocab the graph does not have without a word (and then samples past the logits: the id it
    feeds back breaks the next call); the logits path checks the size."""
    wrong = _edited(ar1[0], lambda d: d["context"].update({"n-vocab": 65}))
    with GenieDialog(wrong) as g:
        assert len(g.token_query(PROMPT, 1)) == 1
        g.reset()
        with pytest.raises(GenieError, match="256 bytes of logits, not 65 float32"):
            g.token_query(PROMPT, 2, logits=True)


def test_no_library_is_runtime_unavailable(monkeypatch, ar1):
    monkeypatch.setitem(sys.modules, "onnxruntime_qnn", None)  # import fails
    with pytest.raises(RuntimeUnavailable):
        genie_library()
    with pytest.raises(RuntimeUnavailable):
        GenieDialog(ar1[0])


def test_config_writer_refuses_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing a.bin, tokenizer.json"):
        write_genie_config(tmp_path, ctx_bins=["a.bin"], context=32, n_vocab=64, bos=1, eos=2, pad=0, kv_dim=8,
                           pos_id_dim=4, rope_theta=1e4, soc_model=69, dsp_arch="v79")


def test_a_dialog_that_stops_at_eos_returns_the_eos_id_with_its_logits_row(ar1, tiny, tmp_path):
    """Genie ends the dialog on its EOS id without emitting it, while the sampler saw its logits: the logits query
    returns the ids up to and including EOS, one logits row each (no row without an id, no id without a row)."""
    import shutil

    cfg, w = tiny
    want, _ = greedy(cfg, w, PROMPT, N_NEW)
    k = next(i for i in range(1, N_NEW) if want[i] not in want[:i])  # an id whose first appearance ends the run
    d = tmp_path / "eos"
    shutil.copytree(ar1[0].parent, d)
    write_genie_config(d, ctx_bins=[p.name for p in d.glob("*_ctx_qnn.bin")], context=cfg.context, n_vocab=cfg.vocab,
                       bos=-1, eos=want[k], pad=0, kv_dim=cfg.head_dim, pos_id_dim=cfg.pos_dim,
                       rope_theta=cfg.rope_theta, soc_model=DEVICE.soc_model, dsp_arch=f"v{DEVICE.htp_arch}")
    with GenieDialog(d / "genie_config.json") as g:
        assert g.token_query(PROMPT, N_NEW) == want[:k]  # Genie itself never emits the EOS id
        g.reset()
        ids, rows = g.token_query(PROMPT, N_NEW, logits=True)
    assert ids == want[:k + 1] and rows.shape == (k + 1, cfg.vocab)
    assert [int(r.argmax()) for r in rows] == ids


def test_a_prompt_longer_than_context_less_ar_plus_one_is_refused(tmp_path, tiny):
    """With an AR-N prompt processor Genie takes a prompt of at most C - N + 1 tokens (``genie.max_prompt_tokens``),
    whatever it is asked to generate: at C 32 with AR-8, 25 tokens generate up to C, 26 are refused before any token
    (the trained Gemma 3's 605-token passage, bos-token included, at C 640 with AR-128 was refused so)."""
    from omni_export.exporters.genie import max_prompt_tokens

    cfg, w = tiny
    bins = [compile_ctx(tiny_lm_onnx(cfg, w, ar, tmp_path / f"lm_ar{ar}.onnx"), f"lm_ar{ar}") for ar in (8, 1)]
    most = max_prompt_tokens(cfg.context, 8)
    assert most == 25
    with GenieDialog(bundle(tmp_path, cfg, bins)) as g:
        prompt = [(i * 7) % 60 + 1 for i in range(most)]
        assert len(g.token_query(prompt, cfg.context - most)) == cfg.context - most
        g.reset()
        with pytest.raises(GenieError, match="Context Size was exceeded"):
            g.token_query(prompt + [5], 1)
