"""Hand-made graphs in Genie's IO contract for the Genie binding's tests: a tiny decoder LM (numpy weights) and a
probe whose logits are the values Genie feeds in (mask row, cos/sin row, layer 0's cache slots), so a test reads
what Genie writes through the logits it returns.

IO (what Genie looks for): ``input_ids`` int32 [1, AR], ``attention_mask`` [1, 1, AR, C], ``position_ids_cos`` /
``position_ids_sin`` [1, 1, AR, hd/2], ``past_key_{i}_in`` [nkv, 1, hd, C-AR], ``past_value_{i}_in``
[nkv, 1, C-AR, hd] -> ``logits`` [1, AR, V], ``past_key_{i}_out`` [nkv, 1, hd, AR], ``past_value_{i}_out``
[nkv, 1, AR, hd]. The graph attends over [cache slots (C-AR) | this call's AR rows], in that order.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


@dataclass(frozen=True)
class Tiny:
    vocab: int = 64
    context: int = 32
    layers: int = 2
    hidden: int = 32
    n_kv: int = 2
    head_dim: int = 8
    rope_theta: float = 10000.0
    seed: int = 0
    weights: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def pos_dim(self) -> int:
        return self.head_dim // 2

    def make_weights(self) -> dict:
        rng = np.random.default_rng(self.seed)
        D, A = self.hidden, self.n_kv * self.head_dim
        w = {"embed": rng.normal(0, 1, (self.vocab, D)), "lm_head": rng.normal(0, 3 / np.sqrt(D), (D, self.vocab))}
        for i in range(self.layers):
            w |= {f"wq{i}": rng.normal(0, 1 / np.sqrt(D), (D, A)), f"wk{i}": rng.normal(0, 1 / np.sqrt(D), (D, A)),
                  f"wv{i}": rng.normal(0, 1 / np.sqrt(D), (D, A)), f"wo{i}": rng.normal(0, 1 / np.sqrt(A), (A, D)),
                  f"w1{i}": rng.normal(0, 1 / np.sqrt(D), (D, 2 * D)),
                  f"w2{i}": rng.normal(0, 0.5 / np.sqrt(2 * D), (2 * D, D))}
        return {k: v.astype(np.float32) for k, v in w.items()}


def rope(cfg: Tiny, positions) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [n, hd/2] at ``positions``: angle p * theta^(-2i/hd)."""
    inv = cfg.rope_theta ** (-np.arange(0, cfg.head_dim, 2) / cfg.head_dim)
    ang = np.asarray(positions, dtype=np.float64)[:, None] * inv[None]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def reference_logits(cfg: Tiny, w: dict, ids) -> np.ndarray:
    """The tiny LM over the whole sequence ``ids`` (causal), fp32 numpy: logits [n, V]."""
    n, hd, h = len(ids), cfg.head_dim, cfg.pos_dim
    cos, sin = rope(cfg, np.arange(n))
    x = w["embed"][np.asarray(ids)]
    causal = np.triu(np.full((n, n), -np.inf, np.float32), 1)

    def rot(t):  # [nkv, n, hd]
        a, b = t[..., :h], t[..., h:]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], -1)

    for i in range(cfg.layers):
        q, k, v = ((x @ w[f"w{c}{i}"]).reshape(n, cfg.n_kv, hd).transpose(1, 0, 2) for c in "qkv")
        s = rot(q) @ rot(k).transpose(0, 2, 1) / np.sqrt(hd) + causal
        p = np.exp(s - s.max(-1, keepdims=True))
        a = (p / p.sum(-1, keepdims=True)) @ v
        x = x + a.transpose(1, 0, 2).reshape(n, -1) @ w[f"wo{i}"]
        x = x + np.maximum(x @ w[f"w1{i}"], 0) @ w[f"w2{i}"]
    return x @ w["lm_head"]


def greedy(cfg: Tiny, w: dict, prompt, n_new: int) -> tuple[list[int], np.ndarray]:
    """numpy's argmax chain: the ``n_new`` ids after ``prompt`` and the logits [n_new, V] each was chosen from."""
    ids, out, rows = list(prompt), [], []
    for _ in range(n_new):
        row = reference_logits(cfg, w, ids)[-1]
        rows.append(row)
        out.append(int(row.argmax()))
        ids.append(out[-1])
    return out, np.stack(rows)


class _G:
    def __init__(self):
        self.nodes, self.inits, self.n = [], [], 0

    def const(self, arr, dtype=np.float32):
        self.n += 1
        name = f"c{self.n}"
        self.inits.append(numpy_helper.from_array(np.asarray(arr, dtype=dtype), name))
        return name

    def op(self, op, *ins, out=None, **attrs):
        self.n += 1
        out = out or f"t{self.n}"
        self.nodes.append(helper.make_node(op, list(ins), [out], **attrs))
        return out


# Quantized IO (``quant=True``): (dtype, scale, zero point) of each input/output family, in the graph as
# DequantizeLinear after an input / QuantizeLinear before an output. KV: uint8 with scale 1, so a probe's markers
# (ids, ids + 100) are exact.
QUANT_IO = {"attention_mask": (TensorProto.UINT16, 1000 / 65535, 65535), "rope": (TensorProto.UINT16, 2 / 65535, 32768),
            "kv": (TensorProto.UINT8, 1.0, 0)}


def _io(cfg: Tiny, ar: int, layers=None, first=True, last=True, quant=False):
    C, hd, nkv = cfg.context, cfg.head_dim, cfg.n_kv
    f = TensorProto.FLOAT
    fm, fr, fk = (QUANT_IO[k][0] for k in ("attention_mask", "rope", "kv")) if quant else (f, f, f)
    ins = [helper.make_tensor_value_info("input_ids", TensorProto.INT32, [1, ar]) if first else
           helper.make_tensor_value_info("hidden", f, [1, ar, cfg.hidden]),
           helper.make_tensor_value_info("attention_mask", fm, [1, 1, ar, C]),
           helper.make_tensor_value_info("position_ids_cos", fr, [1, 1, ar, cfg.pos_dim]),
           helper.make_tensor_value_info("position_ids_sin", fr, [1, 1, ar, cfg.pos_dim])]
    outs = [helper.make_tensor_value_info("logits", f, [1, ar, cfg.vocab]) if last else
            helper.make_tensor_value_info("hidden", f, [1, ar, cfg.hidden])]
    for i in (range(cfg.layers) if layers is None else layers):
        ins += [helper.make_tensor_value_info(f"past_key_{i}_in", fk, [nkv, 1, hd, C - ar]),
                helper.make_tensor_value_info(f"past_value_{i}_in", fk, [nkv, 1, C - ar, hd])]
        outs += [helper.make_tensor_value_info(f"past_key_{i}_out", fk, [nkv, 1, hd, ar]),
                 helper.make_tensor_value_info(f"past_value_{i}_out", fk, [nkv, 1, ar, hd])]
    return ins, outs


def _save(g: _G, cfg: Tiny, ar: int, path: Path, name: str, **part) -> Path:
    ins, outs = _io(cfg, ar, **part)
    quant = part.get("quant", False)  # 16-bit DequantizeLinear needs opset 21
    model = helper.make_model(helper.make_graph(g.nodes, name, ins, outs, g.inits),
                              opset_imports=[helper.make_opsetid("", 21 if quant else 17)])
    model.ir_version = 10 if quant else 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def tiny_lm_onnx(cfg: Tiny, w: dict, ar: int, path: Path, part: tuple[int, int] | None = None) -> Path:
    """The tiny LM as one AR-``ar`` step graph in Genie's IO; ``part=(k, n)``: layers of part k of n only (k from
    1), chained by the tensor ``hidden`` [1, AR, D] (the first part takes ids, the last one gives logits)."""
    g, hd, h, nkv = _G(), cfg.head_dim, cfg.pos_dim, cfg.n_kv
    k, n = part or (1, 1)
    layers = range((k - 1) * cfg.layers // n, k * cfg.layers // n)
    first, last = k == 1, k == n
    x = (g.op("Gather", g.const(w["embed"]), g.op("Reshape", "input_ids", g.const([ar], np.int64)), axis=0)
         if first else g.op("Reshape", "hidden", g.const([ar, cfg.hidden], np.int64)))
    cos = g.op("Reshape", "position_ids_cos", g.const([1, 1, ar, h], np.int64))
    sin = g.op("Reshape", "position_ids_sin", g.const([1, 1, ar, h], np.int64))

    def heads(t):  # [ar, nkv*hd] -> [nkv, 1, ar, hd]
        t = g.op("Reshape", t, g.const([ar, nkv, 1, hd], np.int64))
        return g.op("Transpose", t, perm=[1, 2, 0, 3])

    def rot(t):
        a = g.op("Slice", t, g.const([0], np.int64), g.const([h], np.int64), g.const([3], np.int64))
        b = g.op("Slice", t, g.const([h], np.int64), g.const([hd], np.int64), g.const([3], np.int64))
        return g.op("Concat", g.op("Sub", g.op("Mul", a, cos), g.op("Mul", b, sin)),
                    g.op("Add", g.op("Mul", b, cos), g.op("Mul", a, sin)), axis=3)

    # a cache slot Genie has not written holds whatever its buffer held (measured: garbage in float32 value slots),
    # so an unwritten slot is zeroed before any arithmetic, not only masked: 0 * inf is NaN
    seen = g.op("ReduceMax", "attention_mask", axes=[2], keepdims=1)  # [1, 1, 1, C]
    seen = g.op("Greater", g.op("Slice", seen, g.const([0], np.int64), g.const([cfg.context - ar], np.int64),
                                g.const([3], np.int64)), g.const(-1.0))
    seen_rows = g.op("Transpose", seen, perm=[0, 1, 3, 2])  # [1, 1, C-AR, 1]
    for i in layers:
        q = rot(heads(g.op("MatMul", x, g.const(w[f"wq{i}"]))))
        k = rot(heads(g.op("MatMul", x, g.const(w[f"wk{i}"]))))
        v = heads(g.op("MatMul", x, g.const(w[f"wv{i}"])))
        k_out = g.op("Transpose", k, perm=[0, 1, 3, 2], out=f"past_key_{i}_out")
        g.op("Identity", v, out=f"past_value_{i}_out")
        zero = g.const(0.0)
        keys = g.op("Concat", g.op("Where", seen, f"past_key_{i}_in", zero), k_out, axis=3)  # [nkv, 1, hd, C]
        vals = g.op("Concat", g.op("Where", seen_rows, f"past_value_{i}_in", zero), f"past_value_{i}_out",
                    axis=2)  # [nkv, 1, C, hd]
        s = g.op("Add", g.op("Mul", g.op("MatMul", q, keys), g.const(1 / np.sqrt(hd))), "attention_mask")
        a = g.op("MatMul", g.op("Softmax", s, axis=-1), vals)  # [nkv, 1, ar, hd]
        a = g.op("Reshape", g.op("Transpose", a, perm=[1, 2, 0, 3]), g.const([ar, nkv * hd], np.int64))
        x = g.op("Add", x, g.op("MatMul", a, g.const(w[f"wo{i}"])))
        m = g.op("Relu", g.op("MatMul", x, g.const(w[f"w1{i}"])))
        x = g.op("Add", x, g.op("MatMul", m, g.const(w[f"w2{i}"])))
    if last:
        g.op("Reshape", g.op("MatMul", x, g.const(w["lm_head"])), g.const([1, ar, cfg.vocab], np.int64), out="logits")
    else:
        g.op("Reshape", x, g.const([1, ar, cfg.hidden], np.int64), out="hidden")
    return _save(g, cfg, ar, path, f"tiny_ar{ar}_{k}_of_{n}", layers=layers, first=first, last=last)


def probe_layout(cfg: Tiny, ar: int) -> dict[str, slice]:
    """Where the probe graph puts each fed value in a logits row (row t: what call-row t was fed)."""
    C, h = cfg.context, cfg.pos_dim
    spans, at = {}, 0
    for name, n in (("mask", C), ("cos", h), ("sin", h), ("key_slots", C - ar), ("value_slots", C - ar), ("id", 1)):
        spans[name], at = slice(at, at + n), at + n
    assert at <= cfg.vocab, f"probe needs vocab >= {at}"
    return spans


def probe_onnx(cfg: Tiny, ar: int, path: Path, quant: bool = False) -> Path:
    """A graph in Genie's IO whose logits row t is [attention_mask row t | cos row t | sin row t | layer 0's cache
    slots (key: past_key_0_in[0, 0, 0, :], value: past_value_0_in[0, 0, :, 0]) | input id t | 0-padding], and whose
    cache outputs hold the call's input ids (key: id + 500, value: id + 1500), so a slot shows which token's row
    Genie wrote there. Every other input enters the logits times 0 (the graph keeps it as an input).
    ``quant``: the mask, cos/sin and KV are quantized IO (``QUANT_IO``; logits stay float32, dequantized values), the
    cache markers are then id (key) and id + 100 (value)."""
    g, C, hd, h, nkv = _G(), cfg.context, cfg.head_dim, cfg.pos_dim, cfg.n_kv
    np_dtype = {TensorProto.UINT16: np.uint16, TensorProto.UINT8: np.uint8}

    def dq(name, family):
        if not quant:
            return name
        dt, scale, zp = QUANT_IO[family]
        return g.op("DequantizeLinear", name, g.const(scale), g.const(zp, np_dtype[dt]))

    def q(value, name, family):
        if not quant:
            return g.op("Identity", value, out=name)
        dt, scale, zp = QUANT_IO[family]
        return g.op("QuantizeLinear", value, g.const(scale), g.const(zp, np_dtype[dt]), out=name)

    key_mark, value_mark = (0.0, 100.0) if quant else (500.0, 1500.0)
    idf = g.op("Reshape", g.op("Cast", "input_ids", to=TensorProto.FLOAT), g.const([1, ar, 1], np.int64))
    mask = g.op("Reshape", dq("attention_mask", "attention_mask"), g.const([1, ar, C], np.int64))
    cos = g.op("Reshape", dq("position_ids_cos", "rope"), g.const([1, ar, h], np.int64))
    sin = g.op("Reshape", dq("position_ids_sin", "rope"), g.const([1, ar, h], np.int64))
    past = {f"past_{kind}_{i}_in": dq(f"past_{kind}_{i}_in", "kv")
            for i in range(cfg.layers) for kind in ("key", "value")}

    def slot_row(name, starts, ends):
        t = g.op("Slice", name, g.const(starts, np.int64), g.const(ends, np.int64))
        t = g.op("Reshape", t, g.const([1, 1, C - ar], np.int64))
        return g.op("Expand", t, g.const([1, ar, C - ar], np.int64))

    krow = slot_row(past["past_key_0_in"], [0, 0, 0, 0], [1, 1, 1, C - ar])
    vrow = slot_row(past["past_value_0_in"], [0, 0, 0, 0], [1, 1, C - ar, 1])
    used = probe_layout(cfg, ar)["id"].stop
    row = g.op("Concat", mask, cos, sin, krow, vrow, idf, g.const(np.zeros((1, ar, cfg.vocab - used))), axis=2)
    zero = g.const(0.0)
    for i in range(cfg.layers):
        for kind in ("key", "value"):
            first = g.op("Slice", past[f"past_{kind}_{i}_in"], g.const([0, 0, 0, 0], np.int64),
                         g.const([1, 1, 1, 1], np.int64))
            row = g.op("Add", row, g.op("Mul", g.op("Reshape", first, g.const([1, 1, 1], np.int64)), zero))
        ids4 = g.op("Reshape", idf, g.const([1, 1, ar, 1], np.int64))
        q(g.op("Expand", g.op("Transpose", g.op("Add", ids4, g.const(key_mark)), perm=[0, 1, 3, 2]),
               g.const([nkv, 1, hd, ar], np.int64)), f"past_key_{i}_out", "kv")
        q(g.op("Expand", g.op("Add", ids4, g.const(value_mark)), g.const([nkv, 1, ar, hd], np.int64)),
          f"past_value_{i}_out", "kv")
    g.op("Identity", row, out="logits")
    return _save(g, cfg, ar, path, f"probe_ar{ar}", quant=quant)


def ort_chain(cfg: Tiny, path: Path, prompt, n_new: int) -> tuple[list[int], np.ndarray]:
    """The AR-1 graph at ``path`` on onnxruntime CPU, driven as Genie drives it (mask 0 / -1000, the row of position p
    in slot p): the greedy ids after ``prompt`` and their logits [n_new, V]."""
    import onnxruntime as ort
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    C, hd, nkv = cfg.context, cfg.head_dim, cfg.n_kv
    cache = {f"past_key_{i}_in": np.zeros((nkv, 1, hd, C - 1), np.float32) for i in range(cfg.layers)}
    cache |= {f"past_value_{i}_in": np.zeros((nkv, 1, C - 1, hd), np.float32) for i in range(cfg.layers)}
    names = [o.name for o in sess.get_outputs()]
    seq, out, rows = list(prompt), [], []
    for p in range(len(prompt) + n_new - 1):
        mask = np.full((1, 1, 1, C), -1000.0, np.float32)
        mask[..., :p] = 0
        mask[..., C - 1] = 0
        cos, sin = rope(cfg, [p])
        res = dict(zip(names, sess.run(names, {"input_ids": np.array([[seq[p]]], np.int32), "attention_mask": mask,
                                               "position_ids_cos": cos[None, None], "position_ids_sin": sin[None, None],
                                               **cache})))
        for i in range(cfg.layers):
            cache[f"past_key_{i}_in"][..., p] = res[f"past_key_{i}_out"][..., 0]
            cache[f"past_value_{i}_in"][:, :, p] = res[f"past_value_{i}_out"][:, :, 0]
        if p >= len(prompt) - 1:
            rows.append(res["logits"][0, -1])
            out.append(int(rows[-1].argmax()))
            if len(seq) == p + 1:
                seq.append(out[-1])
    return out, np.stack(rows)


def write_tokenizer(directory: Path, vocab: int) -> Path:
    """A word-level ``tokenizer.json``: id i is the word ``t<i>`` (Genie needs a tokenizer even for token queries)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    tk = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.decoder = decoders.WordPiece()
    path = Path(directory) / "tokenizer.json"
    tk.save(str(path))
    return path


def compile_io_quantized(src: Path, name: str, device) -> str:
    """``src`` (a graph with quantized IO: DequantizeLinear after inputs, QuantizeLinear before outputs) compiled to
    a context binary next to it with its IO quantization kept inside the QNN graph (``offload_graph_io_quantization``
    0: the HTP graph's inputs are the uint8/uint16 tensors Genie writes). Returns the binary's file name."""
    import contextlib

    from omni_export.runtimes.ort import _ort, _qnn_devices
    ort = _ort()
    q, devs = _qnn_devices()
    so = ort.SessionOptions()
    for k, v in {"session.disable_cpu_ep_fallback": "1", "ep.context_enable": "1", "ep.context_embed_mode": "0",
                 "ep.context_file_path": f"{name}_ctx.onnx"}.items():
        so.add_session_config_entry(k, v)
    so.add_provider_for_devices(devs, {"backend_path": q.get_qnn_htp_path(), "soc_model": str(device.soc_model),
                                       "htp_arch": str(device.htp_arch), "enable_htp_prepare_only": "1",
                                       "enable_htp_fp16_precision": "1", "offload_graph_io_quantization": "0"})
    with contextlib.chdir(src.parent):
        ort.InferenceSession(src.name, so)
    return f"{name}_ctx_qnn.bin"
