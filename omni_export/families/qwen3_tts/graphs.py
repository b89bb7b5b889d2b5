"""Qwen3-TTS exported graphs: the talker step, the code predictor (KV-cached step and cache-free window) and the exact
streaming Code2Wav chunk. Inputs and outputs are named by the components (``talker.py``, ``predictor.py``,
``code2wav.py``); RoPE tables and masks come from the host (``host.py``)."""
from __future__ import annotations

import torch
import torch.nn as nn

from ...blocks.layers import run_layers
from .model import CodePredictor, Code2Wav, ConvNeXtBlock, ResidualUnit, Talker

class TalkerStep(nn.Module):
    """One talker decode step over a static cache of ``context`` rows.

    Inputs: ``embeds`` [1,1,H] (codec + text embeddings summed on the host), ``cos``/``sin`` [1,1,1,hd],
    ``mask`` [1,1,1,C+1], ``k_cache_i``/``v_cache_i`` [1,nkv,C,hd]. Outputs: ``logits`` [1,1,3072] (codebook 0 and
    control ids), ``hidden`` [1,1,H] (final-norm state that seeds the code predictor), new K/V rows."""

    def __init__(self, talker: Talker):
        super().__init__()
        self.layers, self.norm, self.codec_head = talker.model.layers, talker.model.norm, talker.codec_head

    def forward(self, embeds, cos, sin, mask, *caches):
        x, new = run_layers(self.layers, embeds, cos, sin, mask, caches)
        h = self.norm(x)
        return (self.codec_head(h), h, *new)


def _stacked_heads(cp: CodePredictor) -> torch.Tensor:
    return torch.stack([h.weight for h in cp.lm_head])  # [G-1, V, Hcp]


class PredictorStep(nn.Module):
    """One code-predictor position over a cache of ``G-1`` rows (a frame has at most G positions).

    Inputs: ``embeds`` [1,1,H_talker] (talker hidden, or a codec embedding gathered on the host), ``cos``/``sin``
    [1,1,1,hd], ``mask`` [1,1,1,G], ``head`` [1,1,G-1] one-hot (which lm_head; all are computed and the one-hot
    selects, so no integer indexes a module list), caches. Outputs: ``logits`` [1,1,V], new K/V rows.
    With ``sampler`` the graph also samples: ``u`` [1,1,1] uniform from the host, top-k at ``temperature``,
    output ``token`` [1,1,1] (float-coded id)."""

    def __init__(self, cp: CodePredictor, sampler: bool = False, top_k: int = 50, temperature: float = 0.9):
        super().__init__()
        self.proj, self.layers, self.norm = cp.small_to_mtp_projection, cp.model.layers, cp.model.norm
        self.heads = nn.Parameter(_stacked_heads(cp).detach().clone(), requires_grad=False)
        self.sampler, self.top_k, self.temperature = sampler, top_k, temperature

    def forward(self, embeds, cos, sin, mask, head, *rest):
        caches = rest[:-1] if self.sampler else rest
        x, new = run_layers(self.layers, self.proj(embeds), cos, sin, mask, caches)
        h = self.norm(x)[:, 0]                                          # [1,Hcp]
        all_logits = torch.matmul(self.heads, h[0])                     # [G-1, V]
        logits = torch.matmul(head[0], all_logits)[None]                # [1,1,V]
        if not self.sampler:
            return (logits, *new)
        return (logits, sample_top_k(logits, rest[-1], self.top_k, self.temperature), *new)


def sample_top_k(logits, u, k: int, temperature: float):
    """Inverse-CDF top-k sampling with a host-supplied uniform ``u`` [1,1,1]: reproducible on every runtime."""
    return top_k_index(logits, u, k, temperature).to(torch.float32)


def top_k_index(logits, u, k: int, temperature: float):
    """The code ``sample_top_k`` draws, as an int64 [1,1,1]: the first of the top ``k`` whose CDF reaches ``u`` (the
    k-th when rounding leaves the CDF under ``u``), so ``u`` = 0 takes the top code. The first index is an argmax over
    distinct scores (k - j where the CDF reaches ``u``, else 0), not a sum of 0/1 flags: a sum of flags, quantized to
    16 bits, comes back off-integer and its cast truncates; an argmax has no tie for a runtime to break."""
    vals, idx = torch.topk(logits / temperature, k, dim=-1)            # [1,1,k]
    cdf = torch.cumsum(torch.softmax(vals, dim=-1), dim=-1)
    reached = torch.cat((cdf[..., :-1] >= u, torch.ones_like(cdf[..., -1:], dtype=torch.bool)), dim=-1)
    score = reached.to(torch.float32) * torch.arange(k, 0, -1, dtype=torch.float32)
    return torch.gather(idx, -1, torch.argmax(score, dim=-1, keepdim=True))


class PredictorFrame(nn.Module):
    """All ``G-1`` code-predictor passes of one frame in one graph, unrolled, the frame's K/V kept inside (it grows
    by one row a pass: every shape is static) and each pass's code sampled in the graph (``top_k_index``) and gathered
    from its codec table as the next pass's input.

    Inputs: ``embeds`` [1,2,H_talker] (talker hidden, C(c0): pass 1 takes both rows), ``cos``/``sin`` [1,1,G,hd],
    ``mask`` [1,1,G,1+G] (column 0 a zero K/V slot, always masked, then causal: every pass, the first too, appends
    its rows to a cache, so all 15 quantize alike; the HTP refused v_proj convs shared by an int16-output first pass
    and uint16-output later ones), ``u`` [1,G-1] host uniforms (0: the top code, greedy), ``forced`` [1,G-1] float-coded
    codes and ``force`` [1,1] (1: pass k+1 reads forced code k, teacher forcing; 0: its own code). Outputs:
    ``logits`` [1,G-1,V] (row k-1 from head k-1) and ``codes`` [1,G-1] (float-coded: each pass's own code, forced or
    not). Codes stay integer from top-k to the gathers and are cast to float once, so no quantizer touches them."""

    def __init__(self, cp: CodePredictor, top_k: int = 50, temperature: float = 0.9):
        super().__init__()
        self.proj, self.layers, self.norm = cp.small_to_mtp_projection, cp.model.layers, cp.model.norm
        self.tables, self.heads = cp.model.codec_embedding, cp.lm_head
        self.top_k, self.temperature = top_k, temperature

    def forward(self, embeds, cos, sin, mask, u, forced, force):
        nkv, hd = self.layers[0].self_attn.nkv, self.layers[0].self_attn.hd
        caches = [torch.zeros(1, nkv, 1, hd)] * (2 * len(self.layers))
        keep, fed = force.to(torch.bool), forced.to(torch.int64)    # [1,1], [1,G-1]
        x, lo, logits, codes = embeds, 0, [], []
        for k in range(1, len(self.heads) + 1):
            h, new = run_layers(self.layers, self.proj(x), cos[:, :, lo:k + 1], sin[:, :, lo:k + 1],
                                mask[:, :, lo:k + 1, :k + 2], caches)
            caches = [torch.cat((c, n), dim=2) for c, n in zip(caches, new)]
            row = self.heads[k - 1](self.norm(h[:, -1:]))              # [1,1,V]
            code = top_k_index(row, u[:, k - 1:k, None], self.top_k, self.temperature)[0]   # [1,1]
            logits.append(row)
            codes.append(code)
            if k < len(self.heads):
                x = self.tables[k - 1](torch.where(keep, fed[:, k - 1:k], code))   # [1,1,H_talker]
            lo = k + 1
        return torch.cat(logits, dim=1), torch.cat(codes, dim=1).to(torch.float32)


class PredictorWindow(nn.Module):
    """The cache-free alternative: one fixed window of G positions, causal mask, every head at once.

    Inputs: ``embeds`` [1,G,H_talker] (slots after the current pass hold anything: the mask hides them),
    ``cos``/``sin`` [1,1,G,hd], ``mask`` [1,1,G,G]. Output: ``logits`` [1,G-1,V] (row j from head j at position
    j+1). The host calls it once per pass and reads row k-1 for code k."""

    def __init__(self, cp: CodePredictor):
        super().__init__()
        self.proj, self.layers, self.norm = cp.small_to_mtp_projection, cp.model.layers, cp.model.norm
        self.heads = nn.Parameter(_stacked_heads(cp).detach().clone(), requires_grad=False)

    def forward(self, embeds, cos, sin, mask):
        x = self.proj(embeds)
        nkv, hd = self.layers[0].self_attn.nkv, self.layers[0].self_attn.hd
        empty = torch.zeros(1, nkv, 0, hd)
        for layer in self.layers:
            x, _, _ = layer(x, cos, sin, mask, empty, empty)
        h = self.norm(x)[0, 1:]                                          # [G-1, Hcp]
        return (torch.matmul(self.heads, h[:, :, None])[None, :, :, 0],)  # [1,G-1,V]


class Code2WavChunk(nn.Module):
    """Exact streaming Code2Wav: one chunk of ``frames`` frames plus the carried state.

    Inputs: ``latents`` [1,codebook_dim,N] (the 16 folded codebook gathers summed on the host), ``cos``/``sin``
    [1,1,N,hd] at the chunk's absolute positions, ``mask`` [1,1,N,W-1+N], per transformer layer ``k_cache_i``/
    ``v_cache_i`` [1,nkv,W-1,hd] (the last W-1 frames, post-RoPE), then ``tail_j`` [1,C_j,L_j] for each causal
    conv (its last L_j input samples). Outputs: ``audio`` [1,1,N*spf], ``k_new_i``/``v_new_i`` [1,nkv,N,hd],
    ``tail_new_j``. Causal convs concatenate their tail instead of padding (so no padded conv is in the graph)."""

    def __init__(self, dec: Code2Wav, frames: int):
        super().__init__()
        self.dec, self.frames = dec, frames
        self.stateful = [dec.pre_conv] + [m for m in dec.conv_stack() if _tail_len(m) > 0]

    def tail_specs(self) -> list[tuple[int, int]]:
        """(channels, samples) of every conv tail, in input order."""
        out = []
        for m in self.stateful:
            conv = m.dwconv.conv if isinstance(m, ConvNeXtBlock) else (m.conv1.conv if isinstance(m, ResidualUnit) else m.conv)
            cin = conv.in_channels
            out.append((cin, _tail_len(m)))
        return out

    def forward(self, latents, cos, sin, mask, *state):
        d, c = self.dec, self.dec.config
        nl = c.num_hidden_layers
        caches, tails = state[: 2 * nl], list(state[2 * nl:])
        new_tails = []
        h, t0 = d.pre_conv.step(latents, tails[0])
        new_tails.append(t0)
        t = d.pre_transformer
        x, new_kv = run_layers(t.layers, t.input_proj(h.transpose(1, 2)), cos, sin, mask, caches)
        x = t.output_proj(t.norm(x)).transpose(1, 2)
        j = 1
        for m in d.conv_stack():
            if _tail_len(m) > 0:
                x, tj = m.step(x, tails[j])
                new_tails.append(tj)
                j += 1
            else:
                x = m(x)
        return (x.clamp(-1.0, 1.0), *new_kv, *new_tails)


def _tail_len(m: nn.Module) -> int:
    if isinstance(m, ConvNeXtBlock):
        return m.dwconv.tail
    if isinstance(m, ResidualUnit):
        return m.conv1.tail
    return getattr(m, "tail", 0)   # causal (transposed) convs and their rewritten forms (graph_forms)
