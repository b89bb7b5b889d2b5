"""Qwen3-TTS per frame, ours against the official ``qwen-tts`` PyTorch pipeline: same seeded weights, same machine.

Ours: the exported graphs of a ``qwen3_tts`` recipe (``omni_export.pipeline``, one store), each runtime through the
family's host loop (``families/qwen3_tts/host.py``) on the first parity prompt, greedy:

- ORT CPU fp32 (``onnx``), ORT CPU QDQ w8a16 (``qdq_onnx``, calibrated as ``qwen3_tts_w8a16`` does),
  ExecuTorch XNNPACK fp32 and dynamic int8 (``executorch`` fp32 / ``w8a8_dynamic``, as ``qwen3_tts_executorch``);
- talker step (1 call a frame); code predictor as the one-call frame graph (``code_predictor_frame``, 1 call a frame)
  and as the KV-cached step graph (``code_predictor_step``, 16 calls a frame); Code2Wav streamed on the serving
  schedule (a 1-frame chunk, then 25-frame chunks: per frame = 25-frame chunk time / 25).

Theirs: ``qwen_tts.Qwen3TTSModel`` (``qwen-tts`` with transformers, a benchmark-only dependency: run with
``--official-python`` of a scratch virtualenv, never a dependency of this package) loading a model directory written
from the very same tensors (``families/qwen3_tts/checkpoint.save_checkpoint`` plus the config fields, generation
config, byte-level text tokenizer and feature-extractor config that ``qwen_tts`` needs and the checkpoint writer
leaves out). ``generate_custom_voice`` is timed end to end with its stages instrumented: the talker forward of each
frame (without the code predictor it calls inside), the code predictor's ``generate`` of 15 codes, and the speech
tokenizer's decode of the whole utterance (``chunked_decode``), per frame.

Same weights is checked, not assumed: every talker / code predictor / decoder tensor of the official model is
compared with the file it was loaded from, and on the same inputs (our eager run's talker input rows, talker hidden
states and codes) the official talker logits, code predictor codes and decoder audio are compared with ours.

Threads: 2 intra-op threads for every runtime (ORT ``OMNI_EXPORT_THREADS``, the XNNPACK threadpool,
``torch.set_num_threads`` in the official process); torch in our process at 1 thread while our runtimes are timed
(its idle OpenMP workers otherwise take the cores, see ``docs/performance.md``). One untimed pass, then ``--passes``
timed passes of ``--frames`` frames; medians over every timed call.

    python benchmarks/qwen3_tts_vs_official.py --official-python SCRATCH_VENV/bin/python                  # tiny
    python benchmarks/qwen3_tts_vs_official.py --official-python SCRATCH_VENV/bin/python --preset 0.6B --store STORE

The scratch virtualenv: ``pip install torch==2.13.0 transformers==4.57.3 torchaudio==2.11.1 qwen-tts==0.1.1``.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

RUNS = (("onnx", "fp32"), ("qdq_onnx", "w8a16"), ("executorch", "fp32"), ("executorch", "w8a8_dynamic"))
COMPONENTS = ("talker_step", "code_predictor_frame", "code_predictor_step", "code2wav_first", "code2wav")
RESULTS = Path(__file__).resolve().parent / "results"
# text-tokenizer ids of the synthesized model directory: (im_start, im_end, endoftext, tts_pad, tts_bos, tts_eos,
# "assistant"); the byte-level tokens are ids 0..255. At 0.6B the released special ids; on tiny, ids under its 512.
SPECIAL_IDS = {"0.6B": (151644, 151645, 151643, 151671, 151672, 151673, 77091),
               "tiny": (256, 257, 258, 259, 260, 261, 262)}
SPEAKER, LANGUAGE = "bench", "english"
THINK_IDS = {"codec_think_id": 2154, "codec_nothink_id": 2155, "codec_think_bos_id": 2156, "codec_think_eos_id": 2157}
SPEAKER_ID, LANGUAGE_ID = 3000, 2050


def ms(ts) -> float | None:
    return round(1e3 * statistics.median(ts), 3) if ts else None


# ---------------------------------------------------------------------------------------------------------------
# the official model directory, written from our tensors


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2 / Qwen2 byte-level BPE alphabet: byte -> printable character."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def write_official_dir(bundle, preset: str, d: Path, frames: int) -> dict:
    """``save_checkpoint`` of the model, plus what ``qwen_tts.Qwen3TTSModel.from_pretrained`` reads beyond it."""
    from omni_export.families.qwen3_tts.checkpoint import TOKENIZER_DIR, save_checkpoint
    from omni_export.families.qwen3_tts.config import CODEC_BOS, CODEC_EOS, CODEC_PAD

    save_checkpoint(bundle.module, d)
    cfg = bundle.config
    im_start, im_end, eot, pad, bos, eos, assistant = SPECIAL_IDS.get(preset, SPECIAL_IDS["0.6B"])
    if max(im_start, im_end, eot, pad, bos, eos, assistant) >= cfg.text_vocab_size:
        raise SystemExit(f"preset {preset}: text vocabulary {cfg.text_vocab_size} too small for the tokenizer ids")
    main = json.loads((d / "config.json").read_text())
    half = cfg.talker.head_dim // 2
    sections = [half - 2 * (half * 5 // 16), half * 5 // 16, half * 5 // 16]       # 64 -> [24, 20, 20]
    talker = main["talker_config"] | {
        "hidden_act": "silu", "codec_eos_token_id": CODEC_EOS, "codec_pad_id": CODEC_PAD, "codec_bos_id": CODEC_BOS,
        **THINK_IDS, "spk_id": {SPEAKER: SPEAKER_ID}, "spk_is_dialect": {SPEAKER: False},
        "codec_language_id": {LANGUAGE: LANGUAGE_ID},
        "rope_scaling": {"rope_type": "default", "type": "default", "mrope_section": sections, "interleaved": True}}
    talker["code_predictor_config"] = talker["code_predictor_config"] | {"hidden_act": "silu"}
    main.update({"architectures": ["Qwen3TTSForConditionalGeneration"], "talker_config": talker,
                 "tokenizer_type": "qwen3_tts_tokenizer_12hz", "tts_model_size": "0b6", "tts_model_type": "custom_voice",
                 "im_start_token_id": im_start, "im_end_token_id": im_end, "tts_pad_token_id": pad,
                 "tts_bos_token_id": bos, "tts_eos_token_id": eos, "torch_dtype": "float32"})
    (d / "config.json").write_text(json.dumps(main, indent=2))
    (d / "generation_config.json").write_text(json.dumps({
        "do_sample": False, "top_k": 50, "top_p": 1.0, "temperature": 0.9, "repetition_penalty": 1.05,
        "subtalker_dosample": False, "subtalker_top_k": 50, "subtalker_top_p": 1.0, "subtalker_temperature": 0.9,
        "max_new_tokens": frames + 1}, indent=2))
    # a byte-level BPE with no merges (each UTF-8 byte one token) and the chat specials at fixed ids
    vocab = {c: b for b, c in bytes_to_unicode().items()}
    specials = {"<|im_start|>": im_start, "<|im_end|>": im_end, "<|endoftext|>": eot, "<|tts_pad|>": pad,
                "<|tts_text_bos|>": bos, "<|tts_text_eod|>": eos}
    vocab.update(specials)
    vocab["assistant"] = assistant
    (d / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    (d / "merges.txt").write_text("#version: 0.2\n")
    added = {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                      "special": True} for t, i in specials.items()}
    added[str(assistant)] = {"content": "assistant", "lstrip": False, "normalized": False, "rstrip": False,
                             "single_word": False, "special": False}
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "Qwen2Tokenizer", "added_tokens_decoder": added, "bos_token": None, "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "unk_token": None, "errors": "replace", "model_max_length": 32768,
        "clean_up_tokenization_spaces": False, "split_special_tokens": False}, indent=2))
    tok = d / TOKENIZER_DIR
    st = json.loads((tok / "config.json").read_text())
    spf = cfg.decoder.samples_per_frame
    st.update({"architectures": ["Qwen3TTSTokenizerV2Model"], "input_sample_rate": cfg.decoder.sample_rate,
               "decode_upsample_rate": spf, "encode_downsample_rate": spf,
               "encoder_valid_num_quantizers": cfg.decoder.num_quantizers})
    (tok / "config.json").write_text(json.dumps(st, indent=2))
    (tok / "preprocessor_config.json").write_text(json.dumps({
        "feature_extractor_type": "EncodecFeatureExtractor", "feature_size": 1, "padding_side": "right",
        "padding_value": 0.0, "return_attention_mask": True, "sampling_rate": cfg.decoder.sample_rate}, indent=2))
    return {"text_tokenizer": "byte-level BPE without merges (one token a UTF-8 byte), chat specials at fixed ids",
            "special_ids": dict(specials, assistant=assistant), "speaker": [SPEAKER, SPEAKER_ID],
            "language": [LANGUAGE, LANGUAGE_ID], "speech_tokenizer_encoder": "default MimiConfig, random (unused: "
            "decode only)", "mrope_section": sections}


# ---------------------------------------------------------------------------------------------------------------
# theirs: runs in the scratch virtualenv (qwen_tts + transformers); only the standard library, numpy and torch


def _stub_torchaudio() -> str | None:
    """torchaudio 2.11.1 from the registry is a CUDA build that will not load beside a CPU torch 2.13; qwen_tts
    imports it only for the 25 Hz tokenizer's fbank features, which the 12 Hz decode path never calls."""
    try:
        import torchaudio  # noqa: F401
        return None
    except Exception as e:  # noqa: BLE001
        import importlib.machinery
        import types
        for name in ("torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi"):
            sys.modules[name] = types.ModuleType(name)
            sys.modules[name].__spec__ = importlib.machinery.ModuleSpec(name, None)
        sys.modules["torchaudio"].compliance = sys.modules["torchaudio.compliance"]
        sys.modules["torchaudio.compliance"].kaldi = sys.modules["torchaudio.compliance.kaldi"]
        lib = Path(str(e).split(": ")[-1].strip()).name   # the library's file name only, no machine path
        return f"torchaudio import failed ({type(e).__name__}: cannot load {lib}); stubbed: only the 25 Hz tokenizer uses it"


def official_worker(a) -> int:
    import torch
    torch.set_num_threads(a.threads)
    stub = _stub_torchaudio()
    import warnings
    warnings.filterwarnings("ignore")
    from importlib import metadata

    from qwen_tts import Qwen3TTSModel
    from safetensors.torch import load_file

    d = Path(a.model_dir)
    job = json.loads(Path(a.job).read_text())
    t0 = time.perf_counter()
    tts = Qwen3TTSModel.from_pretrained(str(d), dtype=torch.float32)
    m = tts.model.eval()
    res = {"load_s": round(time.perf_counter() - t0, 1), "torchaudio": stub,
           "attn_implementation": m.config._attn_implementation, "threads": torch.get_num_threads(),
           "versions": {p: _version(metadata, p) for p in ("qwen-tts", "torch", "transformers", "torchaudio",
                                                          "accelerate", "numpy", "tokenizers", "safetensors")}}

    # same weights: every tensor of the files against the loaded model
    same, diff, missing = 0, [], []
    for f, sd in ((d / "model.safetensors", m.state_dict()),
                  (d / "speech_tokenizer" / "model.safetensors", m.speech_tokenizer.model.state_dict())):
        for k, v in load_file(str(f)).items():
            mk = k
            if mk not in sd:
                missing.append(mk)
            elif torch.equal(sd[mk].float(), v.float()):
                same += 1
            else:
                diff.append(mk)
    res["weights"] = {"tensors_identical": same, "tensors_different": diff[:10], "n_different": len(diff),
                      "file_keys_not_in_model": missing[:10], "n_not_in_model": len(missing)}

    # same inputs as our eager run
    ref = np.load(a.inputs)
    talker, cp = m.talker, m.talker.code_predictor
    with torch.no_grad():
        out = talker.model(inputs_embeds=torch.from_numpy(ref["talker_embeds"])[None], use_cache=False)
        h = out.last_hidden_state
        fid = {"talker_logits": talker.codec_head(h)[0].numpy(), "talker_hidden": h[0].numpy()}
        codes, plog = [], []
        for hid, c0 in zip(ref["hidden"], ref["codes"][:, 0]):
            emb = torch.cat((torch.from_numpy(hid)[None, None], talker.get_input_embeddings()(torch.tensor([[int(c0)]]))), 1)
            r = cp.generate(inputs_embeds=emb, max_new_tokens=15, do_sample=False, output_logits=True,
                            return_dict_in_generate=True)
            codes.append(r.sequences[0, -15:].numpy())
            plog.append(torch.cat(r.logits, 0).numpy())
        fid["pred_codes"], fid["pred_logits"] = np.stack(codes), np.stack(plog)
        wav = m.speech_tokenizer.model.decode(torch.from_numpy(ref["codes"])[None], return_dict=True).audio_values[0]
        fid["wav"] = wav.numpy()
    np.savez(a.fidelity_out, **fid)

    # timing: generate_custom_voice with its stages instrumented
    rec = {"talker": [], "pred": [], "pred_calls": 0, "talker_calls": 0, "decode": [], "decoder_calls": 0}
    orig = {"talker": talker.forward, "gen": cp.generate, "cp": cp.forward, "dec": m.speech_tokenizer.decode,
            "decoder": m.speech_tokenizer.model.decoder.forward, "backbone": talker.model.forward}

    @functools.wraps(orig["talker"])   # HF generate validates its kwargs against the forward's signature
    def talker_forward(*args, **kw):
        e = kw.get("inputs_embeds")
        prefill = e is not None and e.shape[1] > 1
        p0 = sum(rec["pred"])
        t = time.perf_counter()
        o = orig["talker"](*args, **kw)
        if not prefill:
            rec["talker"].append(time.perf_counter() - t - (sum(rec["pred"]) - p0))
        return o

    def counted(key, fn):
        @functools.wraps(fn)
        def f(*args, **kw):
            rec[key] += 1
            return fn(*args, **kw)
        return f

    def timed_fn(key, fn):
        @functools.wraps(fn)
        def f(*args, **kw):
            t = time.perf_counter()
            o = fn(*args, **kw)
            rec[key].append(time.perf_counter() - t)
            return o
        return f

    talker.forward = talker_forward
    cp.generate = timed_fn("pred", orig["gen"])
    cp.forward = counted("pred_calls", orig["cp"])
    talker.model.forward = counted("talker_calls", orig["backbone"])
    m.speech_tokenizer.decode = timed_fn("decode", orig["dec"])
    m.speech_tokenizer.model.decoder.forward = counted("decoder_calls", orig["decoder"])
    # EOS is set to an id the talker's own suppression list masks, so every pass makes exactly ``frames`` frames
    kw = {"do_sample": False, "subtalker_dosample": False, "max_new_tokens": job["frames"] + 1,
          "eos_token_id": m.config.talker_config.codec_pad_id}
    passes = []
    for i in range(1 + a.passes):
        for k, v in rec.items():
            rec[k] = [] if isinstance(v, list) else 0
        t = time.perf_counter()
        wavs, sr = tts.generate_custom_voice(text=job["text"], speaker=SPEAKER, language=LANGUAGE, **kw)
        wall = time.perf_counter() - t
        n = len(rec["pred"])
        if i == 0:
            res["warmup"] = {"frames": n, "wall_s": round(wall, 3), "samples": int(wavs[0].shape[0]), "sample_rate": sr}
            continue
        passes.append({"frames": n, "wall_s": wall, "talker": list(rec["talker"]), "pred": list(rec["pred"]),
                       "decode_s": sum(rec["decode"]), "talker_calls": rec["talker_calls"],
                       "pred_calls": rec["pred_calls"], "decoder_calls": rec["decoder_calls"]})
    n = passes[0]["frames"]
    talker_ms = ms([x for p in passes for x in p["talker"]])
    pred_ms = ms([x for p in passes for x in p["pred"]])
    dec_ms = round(1e3 * statistics.median(p["decode_s"] / p["frames"] for p in passes), 3)
    res["timing"] = {
        "frames": n, "passes": len(passes), "frames_per_pass": [p["frames"] for p in passes],
        "talker_ms": talker_ms, "code_predictor_ms": pred_ms, "code2wav_ms_per_frame": dec_ms,
        "frame_total_ms": round(talker_ms + pred_ms + dec_ms, 3),
        "pipeline_wall_ms_per_frame": round(1e3 * statistics.median(p["wall_s"] / p["frames"] for p in passes), 3),
        "calls_per_frame": {"talker": round(passes[0]["talker_calls"] / n, 3),
                            "code_predictor": round(passes[0]["pred_calls"] / n, 3),
                            "code2wav": round(passes[0]["decoder_calls"] / n, 3)},
        "call_counts_per_pass": {"talker_backbone_forward": passes[0]["talker_calls"],
                                 "code_predictor_forward": passes[0]["pred_calls"],
                                 "decoder_forward": passes[0]["decoder_calls"]},
        "what": "talker: Qwen3TTSTalkerForConditionalGeneration.forward of each decode step minus the code predictor "
                "generate it runs inside (prefill excluded); code predictor: code_predictor.generate (15 codes: a "
                "2-row prefill then 14 steps); code2wav: speech_tokenizer.decode of the whole utterance "
                "(chunked_decode, 300-frame chunks) / frames; pipeline wall: generate_custom_voice / frames "
                "(prefill, HF generate loop and decode included)"}
    res["timing"]["calls_per_frame"]["total"] = round(sum(res["timing"]["calls_per_frame"].values()), 3)
    Path(a.out).write_text(json.dumps(res, indent=2))
    return 0


def _version(metadata, p):
    try:
        return metadata.version(p)
    except metadata.PackageNotFoundError:
        return None


# ---------------------------------------------------------------------------------------------------------------
# ours


def make_pipeline(preset: str, store_dir: Path, context: int):
    import dataclasses

    from rich.console import Console

    from omni_export.artifacts.store import Store
    from omni_export.pipeline import Pipeline
    from omni_export.recipes import Build, load_recipe

    base = load_recipe("qwen3_tts_w8a16").with_overrides(preset=preset, context=context)
    et = load_recipe("qwen3_tts_executorch")
    recipe = dataclasses.replace(base, name="bench_qwen3_tts_vs_official", components=COMPONENTS,
                                 builds=tuple(Build(t, s) for t, s in RUNS),
                                 thresholds={**et.thresholds, **base.thresholds,    # not gated here: timing only
                                             "code_predictor_frame/w8a8_dynamic":
                                                 et.thresholds["code_predictor_step/w8a8_dynamic"]})
    pipe = Pipeline(recipe, Store(store_dir), Console(stderr=True))
    plan = pipe.check()
    comps = pipe.load_components(plan)
    return pipe, plan, comps


def build_run(a) -> int:
    """Child process: every component for one TARGET/SCHEME into the store; a status JSON says which built."""
    from omni_export.schemes import get_scheme

    t, s = a.build_only.split("/")
    pipe, plan, comps = make_pipeline(a.preset, Path(a.store), a.context)
    if get_scheme(s).calibrated and get_scheme(s).quantized:
        pipe.calibs = pipe.calibrations(comps, plan)
    status = {}
    for c in a.components.split(","):
        t0 = time.perf_counter()
        try:
            pipe.built(c, t, s)
            status[c] = {"ok": True, "s": round(time.perf_counter() - t0, 1)}
        except Exception as e:  # noqa: BLE001  (recorded, the benchmark goes on without it)
            status[c] = {"ok": False, "s": round(time.perf_counter() - t0, 1), "error": f"{type(e).__name__}: {e}"[:400]}
        pipe.console.log(f"{c} {t}/{s}: {status[c]}")
        Path(a.status).write_text(json.dumps(status, indent=2))   # after each: a killed build keeps what finished
    return 0


def rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def build_children(a, t: str, s: str, store: Path, tmp: Path) -> dict:
    """Every component of TARGET/SCHEME built in child processes; a child over ``--max-build-gb`` resident or
    ``--build-timeout`` is killed, the component it was on recorded as failed, and the rest built in a new child."""
    from llm_side_by_side import first_error_line  # a sibling script (this directory is on sys.path)

    skipped = {c for r, _, c in (k.partition(":") for k in a.skip) if r == f"{t}/{s}"}
    status = {c: {"ok": False, "error": "skipped (--skip)"} for c in skipped}
    todo = [c for c in COMPONENTS if c not in skipped]
    while todo:
        st = tmp / f"status_{t}_{s}_{len(status)}.json"
        cmd = [sys.executable, __file__, "--preset", a.preset, "--store", str(store), "--context", str(a.context),
               "--build-only", f"{t}/{s}", "--status", str(st), "--components", ",".join(todo)]
        log = tmp / f"build_{t}_{s}.log"
        with open(log, "a") as f:
            p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
            start, peak, why = time.perf_counter(), 0, None
            while p.poll() is None:
                peak = max(peak, rss_bytes(p.pid))
                if peak > a.max_build_gb * 2**30:
                    why = f"killed at {peak / 2**30:.1f} GiB resident (--max-build-gb {a.max_build_gb})"
                elif time.perf_counter() - start > a.build_timeout:
                    why = f"killed after {a.build_timeout} s (--build-timeout)"
                if why:
                    p.kill()
                    p.wait()
                    break
                time.sleep(0.5)
        done = json.loads(st.read_text()) if st.is_file() else {}
        status.update(done)
        todo = [c for c in todo if c not in done]
        if todo:   # the child died on todo[0]: record it, go on with the rest
            why = why or f"build process exit {p.returncode}: {first_error_line(log.read_text(errors='replace'))}"
            status[todo[0]] = {"ok": False, "s": round(time.perf_counter() - start, 1), "error": why}
            todo = todo[1:]
    return {c: status[c] for c in COMPONENTS}


def time_ours(host, runs: dict, text: str, frames: int, ref, passes: int, step_frames: int) -> dict:
    """Runners of one runtime -> per-frame medians over ``passes`` timed passes after one untimed one."""
    from omni_export.families.qwen3_tts.host import CHUNK, FIRST_CHUNK, schedule
    from qwen3_tts_frame_latency import timed  # a sibling script (this directory is on sys.path)

    logs = {k: [] for k in ("talker", "frame", "step_frame", "chunk", "loop")}
    sched = schedule(len(ref.codes), FIRST_CHUNK, CHUNK)
    for i in range(1 + passes):
        lg = {k: [] for k in logs}
        if "talker_step" in runs and "code_predictor_frame" in runs:
            t = time.perf_counter()
            got = host.generate(text, 16, frames, talker_run=timed(runs["talker_step"], lg["talker"]),
                                frame_run=timed(runs["code_predictor_frame"], lg["frame"]))
            lg["loop"].append((time.perf_counter() - t) / max(1, len(got.codes)))
        elif "talker_step" in runs:   # talker timed teacher-forced over the reference rows
            caches = host.talker_caches()
            run = timed(runs["talker_step"], lg["talker"])
            for pos, e in enumerate(ref.talker_embeds):
                host.talker_write(caches, run(host.talker_feed(caches, e, pos)), pos)
        if "code_predictor_step" in runs:
            for h, c in list(zip(ref.hidden, ref.codes))[:step_frames]:
                calls = []
                host.pred_frame(timed(runs["code_predictor_step"], calls), h, int(c[0]))
                lg["step_frame"].append(sum(calls))
        if "code_predictor_frame" in runs and "talker_step" not in runs:
            for h, c in zip(ref.hidden, ref.codes):
                host.frame_call(timed(runs["code_predictor_frame"], lg["frame"]), h, int(c[0]))
        if "code2wav" in runs and "code2wav_first" in runs:
            host.stream({FIRST_CHUNK: runs["code2wav_first"], CHUNK: timed(runs["code2wav"], lg["chunk"])}, ref.codes, sched)
        if i:
            for k in logs:
                logs[k] += lg[k]
    talker, frame, step = ms(logs["talker"]), ms(logs["frame"]), ms(logs["step_frame"])
    chunk = ms(logs["chunk"])
    c2w = round(chunk / CHUNK, 3) if chunk is not None else None
    out = {"talker_ms": talker, "code_predictor_frame_ms": frame, "code_predictor_step_ms_per_frame": step,
           "code_predictor_step_ms_per_call": round(step / 16, 3) if step is not None else None,
           "code2wav_chunk_25_ms": chunk, "code2wav_ms_per_frame": c2w,
           "host_loop_ms_per_frame": ms(logs["loop"]), "timed_passes": passes,
           "talker_calls_timed": len(logs["talker"]), "step_frames_timed": len(logs["step_frame"])}
    if None not in (talker, c2w):
        if frame is not None:
            out["frame_total_ms"] = round(talker + frame + c2w, 3)
        if step is not None:
            out["frame_total_step_ms"] = round(talker + step + c2w, 3)
    return out


def fidelity(theirs: dict, ours: dict) -> dict:
    from omni_export.parity.metrics import snr_db

    tl, ol = theirs["talker_logits"], ours["talker_logits"]
    res = {"talker": {"positions": int(tl.shape[0]), "logits_snr_db": round(snr_db(ol, tl), 2),
                      "logits_max_abs_diff": float(np.max(np.abs(ol - tl))),
                      "argmax_agreement": float(np.mean(ol.argmax(-1) == tl.argmax(-1))),
                      "hidden_snr_db": round(snr_db(ours["talker_hidden"], theirs["talker_hidden"]), 2)},
           "code_predictor": {"frames": int(theirs["pred_codes"].shape[0]),
                              "codes_equal_fraction": float(np.mean(theirs["pred_codes"] == ours["pred_codes"])),
                              "logits_snr_db": round(snr_db(ours["pred_logits"], theirs["pred_logits"]), 2)}}
    n = min(len(ours["wav"]), len(theirs["wav"]))
    res["code2wav"] = {"samples": n, "samples_ours": len(ours["wav"]), "samples_theirs": len(theirs["wav"]),
                       "audio_snr_db": round(snr_db(ours["wav"][:n], theirs["wav"][:n]), 2)}
    return res


def eager_reference(host, ref) -> dict:
    """Our eager fp32 outputs on the inputs handed to the official model."""
    import torch

    from omni_export.families.qwen3_tts.host import _eager

    trun = _eager(host.talker_graph, host.talker_names())
    caches, logits, hidden = host.talker_caches(), [], []
    for pos, e in enumerate(ref.talker_embeds):
        o = trun(host.talker_feed(caches, e, pos))
        host.talker_write(caches, o, pos)
        logits.append(o[0].reshape(-1))
        hidden.append(o[1].reshape(-1))
    frun = _eager(host.frame_graph, list(host.frame_feed(host.codec[0], 0)))
    pl, pc = [], []
    for h, c in zip(ref.hidden, ref.codes):
        outs, codes = host.frame_call(frun, h, int(c[0]))
        pl.append(outs[0][0].reshape(15, -1))
        pc.append(codes)
    with torch.no_grad():
        wav = host.full_decode(ref.codes)
    return {"talker_logits": np.stack(logits), "talker_hidden": np.stack(hidden), "pred_logits": np.stack(pl),
            "pred_codes": np.asarray(pc), "wav": wav}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--official-python", help="python of the scratch virtualenv with qwen-tts (default: "
                                              "QWEN_TTS_PYTHON); without it only our side is measured")
    ap.add_argument("--store", help="artifact store (default: a temporary directory; required beyond tiny)")
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--frames", type=int, default=26, help="frames a pass (26 covers the 1 + 25 schedule)")
    ap.add_argument("--passes", type=int, default=3, help="timed passes after one untimed pass")
    ap.add_argument("--step-frames", type=int, help="frames the 16-call step predictor is timed on (default: all)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--build-timeout", type=int, default=3 * 3600, help="seconds for one build child")
    ap.add_argument("--max-build-gb", type=float, default=12.0, help="resident GiB a build child may reach")
    ap.add_argument("--runs", default=",".join(f"{t}/{s}" for t, s in RUNS))
    ap.add_argument("--skip", action="append", default=[], metavar="TARGET/SCHEME:COMPONENT",
                    help="do not build this component for this run (recorded as skipped), e.g. "
                         "executorch/fp32:code_predictor_frame, whose lowering passes 20 GiB at 0.6B")
    ap.add_argument("--out", type=Path)
    # internal modes (child processes)
    ap.add_argument("--build-only", help=argparse.SUPPRESS)
    ap.add_argument("--status", help=argparse.SUPPRESS)
    ap.add_argument("--components", default=",".join(COMPONENTS), help=argparse.SUPPRESS)
    ap.add_argument("--official-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    ap.add_argument("--job", help=argparse.SUPPRESS)
    ap.add_argument("--inputs", help=argparse.SUPPRESS)
    ap.add_argument("--fidelity-out", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.official_worker:
        return official_worker(a)
    if a.build_only:
        return build_run(a)
    runs = [tuple(r.split("/")) for r in a.runs.split(",") if r]
    if any(r not in RUNS for r in runs):
        ap.error(f"--runs: choose from {', '.join(f'{t}/{s}' for t, s in RUNS)}")
    for k in a.skip:
        run, _, comp = k.partition(":")
        if tuple(run.split("/")) not in runs or comp not in COMPONENTS:
            ap.error(f"--skip {k}: expected TARGET/SCHEME:COMPONENT with a run of --runs and one of {', '.join(COMPONENTS)}")
    if a.store is None and a.preset != "tiny":
        ap.error("--store is required beyond the tiny preset (each build runs in its own process)")
    official = a.official_python or os.environ.get("QWEN_TTS_PYTHON")
    out = a.out or RESULTS / f"qwen3_tts_vs_official_{a.preset}.json"
    with tempfile.TemporaryDirectory() as tmp:
        return measure(a, runs, official, out, Path(a.store or Path(tmp) / "store"), Path(tmp))


def measure(a, runs, official, out: Path, store: Path, tmp: Path) -> int:
    import gc

    import torch

    from omni_export.artifacts.provenance import git_revision, toolchain
    from omni_export.artifacts.store import write_json_atomic
    from omni_export.devices import get_device
    from omni_export.exporters import get_target
    from omni_export.families import load_prompt_set
    from llm_side_by_side import first_error_line, pin_threads  # a sibling script (this directory is on sys.path)

    torch.set_num_threads(a.threads)
    t_all = time.perf_counter()
    res = {"benchmark": "Qwen3-TTS per frame, ours vs the official qwen-tts pipeline", "preset": a.preset,
           "context": a.context, "frames": a.frames, "timed_passes": a.passes, "threads": a.threads,
           "machine": {"cpus": os.cpu_count()}, "source_revision": git_revision(), "toolchain": toolchain()}
    # builds, each TARGET/SCHEME in a child process (memory returned between them), watched for peak RSS
    builds = {}
    for t, s in runs:
        t0 = time.perf_counter()
        builds[(t, s)] = build_children(a, t, s, store, tmp)
        print(f"built {t}/{s} in {time.perf_counter() - t0:.0f} s: "
              f"{ {c: v['ok'] for c, v in builds[(t, s)].items()} }", file=sys.stderr, flush=True)
    pipe, plan, comps = make_pipeline(a.preset, store, a.context)
    bundle = pipe.bundle
    host = comps["talker_step"].host
    cfg = bundle.config
    frame_s = cfg.decoder.samples_per_frame / cfg.decoder.sample_rate
    res["frame_ms_of_audio"] = round(1e3 * frame_s, 3)
    res["model"] = bundle.provenance()
    text = load_prompt_set("qwen3_tts_parity").prompts[0]
    res["text"] = text
    ref = host.generate(text, 16, a.frames)       # eager fp32, greedy
    res["frames_generated"] = len(ref.codes)

    # theirs (in the scratch virtualenv), on the same weights
    if official:
        mdir = tmp / "official_model"
        t0 = time.perf_counter()
        res["official_dir"] = write_official_dir(bundle, a.preset, mdir, a.frames)
        ours_fid = eager_reference(host, ref)
        np.savez(tmp / "inputs.npz", talker_embeds=ref.talker_embeds.astype(np.float32),
                 hidden=ref.hidden.astype(np.float32), codes=ref.codes.astype(np.int64))
        (tmp / "job.json").write_text(json.dumps({"text": text, "frames": a.frames}))
        cmd = [official, __file__, "--official-worker", "--model-dir", str(mdir), "--job", str(tmp / "job.json"),
               "--inputs", str(tmp / "inputs.npz"), "--fidelity-out", str(tmp / "fidelity.npz"),
               "--out", str(tmp / "official.json"), "--passes", str(a.passes), "--threads", str(a.threads)]
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env.update({"OMP_NUM_THREADS": str(a.threads), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                    "TOKENIZERS_PARALLELISM": "false"})
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp, check=False)
        if p.returncode or not (tmp / "official.json").is_file():
            res["theirs"] = {"error": f"official worker exit {p.returncode}: {first_error_line(p.stdout)}"}
            print(p.stdout[-4000:], file=sys.stderr)
        else:
            res["theirs"] = json.loads((tmp / "official.json").read_text())
            res["fidelity"] = fidelity(dict(np.load(tmp / "fidelity.npz")), ours_fid)
        res["theirs"]["wall_s"] = round(time.perf_counter() - t0, 1)
        del ours_fid
        gc.collect()
    else:
        res["theirs"] = {"error": "no --official-python given"}

    # ours, one runtime at a time
    pin_threads(a.threads)   # ORT and XNNPACK at a.threads ...
    torch.set_num_threads(1)  # ... and torch's idle OpenMP workers off the cores while ours are timed
    device = get_device(pipe.recipe.device)
    if any(get_scheme_calibrated(s) for _, s in runs):
        pipe.calibs = pipe.calibrations(comps, plan)
    res["ours"] = {}
    for t, s in runs:
        label = f"{t}/{s}"
        st = builds[(t, s)]
        row = {"build": st}
        rs = {}
        try:
            for c in COMPONENTS:
                if st.get(c, {}).get("ok"):
                    built = pipe.built(c, t, s)
                    ex = get_target(t).execution(built, comps[c], device)
                    if ex.run is None:
                        st[c] = {**st[c], "runtime_unavailable": ex.unavailable}
                        continue
                    rs[c] = ex.run
                    row["runtime"] = ex.runtime
            row.update(time_ours(host, rs, text, a.frames, ref, a.passes, a.step_frames or a.frames))
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {e}"[:400]
        row["calls_per_frame"] = {"frame_predictor": round(2 + 1 / 25, 3), "step_predictor": round(17 + 1 / 25, 3)}
        res["ours"][label] = row
        print(f"timed {label}: { {k: v for k, v in row.items() if k.endswith(('_ms', 'frame'))} }",
              file=sys.stderr, flush=True)
        del rs
        gc.collect()
    torch.set_num_threads(a.threads)
    res["ratios"] = ratios(res)
    res["wall_s"] = round(time.perf_counter() - t_all, 1)
    write_json_atomic(out, res)
    print(table(res))
    print(f"wrote {out}", file=sys.stderr)
    return 0


def get_scheme_calibrated(name: str) -> bool:
    from omni_export.schemes import get_scheme
    s = get_scheme(name)
    return bool(s.calibrated and s.quantized)


def ratios(res) -> dict:
    """ours / theirs per stage (< 1: ours faster)."""
    th = res.get("theirs", {}).get("timing")
    if not th:
        return {}
    out = {}
    for label, r in res["ours"].items():
        def q(x, y):
            return round(x / y, 3) if x is not None and y else None
        out[label] = {"talker": q(r.get("talker_ms"), th["talker_ms"]),
                      "code_predictor_frame_graph": q(r.get("code_predictor_frame_ms"), th["code_predictor_ms"]),
                      "code_predictor_step_graph": q(r.get("code_predictor_step_ms_per_frame"), th["code_predictor_ms"]),
                      "code2wav": q(r.get("code2wav_ms_per_frame"), th["code2wav_ms_per_frame"]),
                      "frame_total": q(r.get("frame_total_ms"), th["frame_total_ms"]),
                      "frame_total_step_predictor": q(r.get("frame_total_step_ms"), th["frame_total_ms"])}
    return out


def table(res) -> str:
    fm = res["frame_ms_of_audio"]

    def f(x):
        return "-" if x is None else f"{x:.1f}"

    def rtf(x):
        return "-" if x is None else f"{x / fm:.2f}"

    lines = [f"Qwen3-TTS {res['preset']}, ms per frame ({fm:.0f} ms of audio a frame), {res['threads']} threads",
             ("| runtime | talker | predictor (frame graph / 16-call step graph) | Code2Wav | frame total (frame / step) "
              "| RTF (frame / step) | calls a frame (frame / step) |"), "|---|---|---|---|---|---|---|"]
    th = res.get("theirs", {}).get("timing")
    if th:
        lines.append(f"| official qwen-tts PyTorch fp32 | {f(th['talker_ms'])} | {f(th['code_predictor_ms'])} | "
                     f"{f(th['code2wav_ms_per_frame'])} | {f(th['frame_total_ms'])} (pipeline wall "
                     f"{f(th['pipeline_wall_ms_per_frame'])}) | {rtf(th['frame_total_ms'])} | "
                     f"{th['calls_per_frame']['total']} |")
    for label, r in res["ours"].items():
        if "error" in r and r.get("talker_ms") is None:
            lines.append(f"| ours {label} | error: {r['error'][:80]} | | | | | |")
            continue
        lines.append(f"| ours {label} | {f(r.get('talker_ms'))} | {f(r.get('code_predictor_frame_ms'))} / "
                     f"{f(r.get('code_predictor_step_ms_per_frame'))} | {f(r.get('code2wav_ms_per_frame'))} | "
                     f"{f(r.get('frame_total_ms'))} / {f(r.get('frame_total_step_ms'))} | {rtf(r.get('frame_total_ms'))} / "
                     f"{rtf(r.get('frame_total_step_ms'))} | {r['calls_per_frame']['frame_predictor']} / "
                     f"{r['calls_per_frame']['step_predictor']} |")
    if res.get("ratios"):
        lines += ["", "ours / theirs (< 1: ours faster)", ("| runtime | talker | predictor frame / step | Code2Wav | "
                  "frame total (frame / step) |"), "|---|---|---|---|---|"]
        for label, q in res["ratios"].items():
            lines.append(f"| {label} | {q['talker']} | {q['code_predictor_frame_graph']} / {q['code_predictor_step_graph']}"
                         f" | {q['code2wav']} | {q['frame_total']} / {q['frame_total_step_predictor']} |")
    if res.get("fidelity"):
        lines.append("")
        lines.append(f"fidelity (official vs our eager fp32, same inputs): {json.dumps(res['fidelity'])}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
