"""Parity metrics: an artifact's trace against a reference trace, step by step.

Per output: SNR in dB (signal = reference energy, noise = the difference, over every step measured), max absolute
error and cosine similarity. For LM heads, over the generated positions of each sequence: teacher-forced top-1
agreement with the reference's greedy token, the largest |log p| difference of that token, KL-divergence statistics
and perplexities (``lm_figures``), and free-running greedy agreement (position-wise, and the agreed prefix length per
prompt) where the trace generated on its own. For audio components, the mean absolute log-mel
difference (dB) of the whole waveform (its waveform SNR is the ``audio`` output's SNR).
"""
from __future__ import annotations

import numpy as np

from ..components.base import FLOOR  # a reference's eager fp32 result beside a more exact target (``compare``)
from .lm_metrics import CHUNK_ROWS, greedy_agreement, lm_stats, perplexity
from .metric_specs import METRICS, SNR_CAP, snr_db  # noqa: F401 (SNR_CAP: re-exported)
from .metric_specs import names as metric_names

FIRST_POSITION = 1  # LM token figures are judged from position 1: position 0 (the attention sink) comes from the prefill


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def mel_filterbank(sr: int, n_fft: int, n_mels: int) -> np.ndarray:
    """Triangular HTK-mel filters [n_mels, n_fft//2 + 1]."""
    mel = lambda f: 2595.0 * np.log10(1.0 + f / 700.0)
    hz = lambda m: 700.0 * (10.0 ** (m / 2595.0) - 1.0)
    pts = hz(np.linspace(mel(0.0), mel(sr / 2.0), n_mels + 2))
    freqs = np.linspace(0.0, sr / 2.0, n_fft // 2 + 1)
    lo, mid, hi = pts[:-2, None], pts[1:-1, None], pts[2:, None]
    return np.maximum(0.0, np.minimum((freqs - lo) / (mid - lo), (hi - freqs) / (hi - mid)))


def log_mel(wav: np.ndarray, sr: int = 24000, n_fft: int = 1024, hop: int = 256, n_mels: int = 80) -> np.ndarray:
    """Log-mel power in dB [frames, n_mels] (Hann window, floor 1e-10)."""
    w = np.asarray(wav, np.float64).reshape(-1)
    if len(w) < n_fft:
        w = np.pad(w, (0, n_fft - len(w)))
    n = 1 + (len(w) - n_fft) // hop
    frames = np.lib.stride_tricks.sliding_window_view(w, n_fft)[::hop][:n] * np.hanning(n_fft)
    power = np.abs(np.fft.rfft(frames, axis=-1)) ** 2
    return 10.0 * np.log10(np.maximum(power @ mel_filterbank(sr, n_fft, n_mels).T, 1e-10))


def log_mel_distance(ref: np.ndarray, test: np.ndarray, sr: int = 24000) -> float:
    """Mean absolute log-mel difference in dB (0 = identical spectra)."""
    return float(np.mean(np.abs(log_mel(ref, sr) - log_mel(test, sr))))


def _rows(t) -> int:
    return len(next(iter(t.outputs.values()))) if t.outputs else 0


def _joined(arrays: list[np.ndarray]) -> np.ndarray:
    """``arrays`` end to end on axis 0; one array is returned as it is, not copied (a prefill's one parity passage:
    605 rows of Gemma 3's 262,144 logits are 634 MB an array)."""
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


def compared_steps(trace, first_step: int = 0) -> int:
    """The steps ``compare`` measures in ``trace``: per sequence, those from ``first_step`` on."""
    return sum(max(0, _rows(t) - first_step) for t in trace)


def compare(reference, trace, lm: bool, audio: bool = False, first_step: int = 0) -> dict:
    """``reference``/``trace``: lists of ``Sequence`` (the trace may cover fewer steps). ``audio``: the component
    outputs a waveform named ``audio`` (per step a chunk): also report the log-mel distance over the whole of it.
    ``first_step``: per sequence, the steps before it are the reference's own rows, not the artifact's
    (``Component.parity_first_step``: a decode step's attention sink): no figure compares them (identical rows
    would add signal without error and lift every SNR), and ``steps`` counts only the steps compared."""
    pairs = [(r, t) for r, t in zip(reference, trace) if _rows(t) > first_step]
    if not pairs:
        raise ValueError("the trace has no steps to compare")
    names = list(pairs[0][1].outputs)

    def ref_rows(key: str, n: str) -> np.ndarray:  # the reference's entry ``key`` on the rows output ``n`` compares
        return _joined([r.outputs[key][first_step: len(t.outputs[n])] for r, t in pairs])

    def test_rows(n: str) -> np.ndarray:
        return _joined([t.outputs[n][first_step:] for _, t in pairs])
    per_output = {}
    for n in names:
        ref, test = ref_rows(n, n), test_rows(n)
        per_output[n] = {m: METRICS[m].measure(ref, test) for m in metric_names("output")}
        if all(FLOOR + n in r.outputs for r, _ in pairs):
            per_output[n]["eager_fp32_snr_db"] = round(snr_db(ref, ref_rows(FLOOR + n, n)), 3)
    result = {"steps": compared_steps([t for _, t in pairs], first_step), "sequences": len(pairs),
              "outputs": per_output}
    if first_step:
        result["first_step"] = first_step
    if audio:
        ref, test = ref_rows("audio", "audio").reshape(-1), test_rows("audio").reshape(-1)
        result["audio"] = {"log_mel_distance": round(log_mel_distance(ref, test), 4), "samples": int(ref.size)}
    if lm:
        result["lm"] = lm_figures(pairs, first_step)
    return result


def _text_len(r) -> int:
    """Tokens of ``r.tokens`` that are held-out text: the prompt of a decode-step sequence (the rest are fp32's greedy
    tokens fed back), every token of a prefill sequence (``n_prompt`` 1, one fp32 argmax per position)."""
    return len(r.tokens) if r.n_prompt <= 1 else r.n_prompt


def lm_figures(pairs, first_step: int = 0) -> dict:
    """Token figures over each sequence's teacher-forced positions from ``FIRST_POSITION`` on (position 0 is the
    attention sink: in deployment the prefill writes its cache rows, see ``DecodeStepComponent.trace``), or from
    ``first_step`` where the rows before it are fp32's (a decode step's ``parity_from``): top-1 against
    fp32's greedy token, max |dlogp| of that token, llama.cpp's KL-divergence statistics (``lm_metrics.lm_stats``),
    perplexity of fp32 and of the artifact on the held-out text's next tokens, and free-running greedy agreement."""
    agree = total = 0
    dlp = 0.0
    g_agree = g_total = 0
    refs, tests, text_ref, text_test, text_tg, runs = [], [], [], [], [], []
    first = max(FIRST_POSITION, first_step)
    for r, t in pairs:
        steps = len(t.outputs["logits"])
        lr_all = r.outputs["logits"][:steps].reshape(steps, -1)
        lt_all = t.outputs["logits"].reshape(steps, -1)
        if steps > first:
            refs.append(lr_all[first:])
            tests.append(lt_all[first:])
            n_text = min(steps, _text_len(r) - 1)  # positions whose next token is held-out text
            # A prompt of rows that are not vocabulary tokens (a TTS head's condition rows) is no text to score.
            if n_text > first and max(r.tokens[first + 1: n_text + 1]) < lr_all.shape[-1]:
                text_ref.append(lr_all[first:n_text])
                text_test.append(lt_all[first:n_text])
                text_tg.extend(r.tokens[first + 1: n_text + 1])
        lo = max(r.n_prompt - 1, first)  # logits at step n_prompt-1+j predict generated token j
        targets = r.generated[lo - (r.n_prompt - 1): max(0, steps - (r.n_prompt - 1))]
        if targets:
            hits, delta = _forced_top1(lr_all[lo: lo + len(targets)], lt_all[lo: lo + len(targets)], targets)
            agree += hits
            total += len(targets)
            dlp = max(dlp, delta)
        if t.generated:
            ref_gen = r.generated[:len(t.generated)] if t.stopped_at_eos else r.generated
            g_agree += sum(int(a == b) for a, b in zip(t.generated, ref_gen))
            g_total += len(ref_gen)
            runs.append(greedy_agreement(ref_gen, t.generated))
    out = {
        "top1_agreement": round(agree / total, 4) if total else None, "top1_positions": total,
        "max_logprob_delta": dlp if total else None,
        "greedy_agreement": round(g_agree / g_total, 4) if g_total else None, "greedy_positions": g_total,
        "greedy_tokens_min": min(runs) if runs else None,
        "greedy_tokens": runs or None, "first_position": first,
    }
    if runs:  # the token ids themselves, for the reports' text side by side (``parity.texts``)
        out["fp32_greedy_ids"] = [list(map(int, r.generated[:len(t.generated)] if t.stopped_at_eos else r.generated))
                                  for r, t in pairs if t.generated]
        out["greedy_ids"] = [list(map(int, t.generated)) for _, t in pairs if t.generated]
    if refs:
        ref, test = _joined(refs), _joined(tests)
        st = lm_stats(ref, test)
        out.update(kld_positions=st.positions, kld_mean=st.kld_mean, kld_p99=st.kld_p99, kld_max=st.kld_max,
                   same_top_p=round(st.same_top_p, 4))
        out.update({m: METRICS[m].measure(ref, test) for m in metric_names("lm") if METRICS[m].compute is not None})
        del ref, test, refs, tests  # before the text's rows are joined: never both sets at once
    if text_tg:
        ref, test = _joined(text_ref), _joined(text_test)
        with np.errstate(over="ignore"):
            p_ref, p_art = perplexity(ref, text_tg), perplexity(test, text_tg)
        fin = lambda v: v if np.isfinite(v) else None  # an overflowing perplexity is reported unmeasured (JSON)
        with np.errstate(over="ignore", invalid="ignore"):
            out.update(ppl_positions=len(text_tg), ppl_fp32=fin(p_ref), ppl=fin(p_art), delta_ppl=fin(p_art - p_ref),
                       ppl_ratio=fin(p_art / p_ref))
    return out


def _forced_top1(ref_logits: np.ndarray, test_logits: np.ndarray, targets) -> tuple[int, float]:
    """(positions whose artifact argmax is the target, the largest |log p| difference of the target) over the rows
    of ``[positions, ...]`` logits, ``CHUNK_ROWS`` positions at a time: each position's figures are its own, so they
    are those of one pass over all of them (a prefill's 604 positions of Gemma 3's vocabulary in float64 at once
    held 5-6 GB of log-probabilities and temporaries)."""
    tg_all, agree, dlp = np.asarray(targets), 0, 0.0
    for i in range(0, len(tg_all), CHUNK_ROWS):
        rows = slice(i, i + CHUNK_ROWS)
        tg, lr, lt = tg_all[rows], log_softmax(ref_logits[rows]), log_softmax(test_logits[rows])
        idx = np.arange(len(tg))
        agree += int(np.sum(lt.argmax(-1) == tg))
        dlp = max(dlp, float(np.max(np.abs(lt[idx, tg] - lr[idx, tg]))))
    return agree, dlp


def snr_summary(parity: dict) -> dict:
    """Logits SNR and the weakest other output's (the K/V rows of an LM step): a three-way comparison's row."""
    outs = parity["outputs"]
    kv = [v["snr_db"] for k, v in outs.items() if k != "logits"]
    s = {"logits": outs["logits"]["snr_db"]} if "logits" in outs else {}
    if kv:
        s["kv_rows_min"] = min(kv)
    return s
