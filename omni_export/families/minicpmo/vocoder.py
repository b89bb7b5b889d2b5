"""MiniCPM-o Token2wav components: ``flow_encoder`` (25 + 3 tokens -> 50 frames of mu), ``dit_step`` (one estimator
call of the 10-step x CFG Euler loop) and ``hift`` (one window of the exact HiFT stream), each with its host loop.

``SpeechHost`` runs an utterance for a parity prompt: audio codes from the TTS head (greedy, eager fp32; EOS
dropped), three silence tokens first (as every reply starts), a seeded voice (prompt tokens, prompt mel, x-vector:
the prompt caches are fixed per voice, so the prompt chunks run eagerly in fp32 on every runtime, as caches
shipped with the app would be) and seeded noise. Each component's reference is the exact arithmetic (fp64 whole-
utterance decode) for the signal it hands on (``mu``, ``mel``, ``audio``), with the eager fp32 stream's own SNR
beside it; its state outputs are checked against the eager fp32 stream, as Code2Wav's are.
"""
from __future__ import annotations

import copy

import numpy as np
import torch

from ...components.base import FLOOR, Component, Sequence, TensorSpec
from .components import TTSHeadPrefill, TTSHeadStep
from .config import SILENCE_TOKEN
from .flow_host import FlowHost, schedule
from .graphs import dit_step, eager, encoder_chunk, hift_window
from .hift_host import HiFTHost

PROMPT_FRAMES = 20   # the seeded voice prompt: 10 tokens, 20 mel frames (caches capped at 20 + 100 frames)


class SpeechHost:
    def __init__(self, bundle, context: int, prompt_frames: int = PROMPT_FRAMES, seed: int = 0):
        """``context``: the TTS head's context for the codes of an utterance (prompt rows + new codes)."""
        m, cfg = bundle.module, bundle.config
        self.m, self.cfg, self.P, self.context = m, cfg, prompt_frames, context
        self.flow = FlowHost(m.flow, cfg, prompt_frames)
        self.hift = HiFTHost(m.hift, cfg, cfg.chunk_frames, seed)
        rng = np.random.default_rng(seed)
        self.prompt_tokens = rng.integers(0, cfg.encoder.vocab_size, prompt_frames // 2)
        self.prompt_mel = (0.5 * rng.standard_normal((80, prompt_frames))).astype(np.float32)
        xvec = rng.standard_normal((1, cfg.encoder.spk_embed_dim)).astype(np.float32)
        with torch.no_grad():
            self.spk = m.flow.spk(torch.from_numpy(xvec))[0].numpy()
        self.noise = rng.standard_normal((80, prompt_frames + cfg.history_frames + 2 * cfg.chunk_frames)).astype(
            np.float32)
        self.enc_graph = encoder_chunk(m, cfg.chunk_tokens, self.flow.cap1)
        self.dit_graph = dit_step(m, cfg.chunk_frames, self.flow.cap2)
        self.prompt_enc = eager(encoder_chunk(m, prompt_frames // 2, self.flow.cap1))
        self.prompt_dit = eager(dit_step(m, prompt_frames, self.flow.cap2))
        self._memo: dict = {}
        self._bundle = bundle

    def tokens(self, text: str, max_prompt_tokens: int, new_tokens: int) -> np.ndarray:
        key = ("tokens", text, max_prompt_tokens, new_tokens)
        if key not in self._memo:
            if max_prompt_tokens + new_tokens > self.context:
                raise ValueError(f"{max_prompt_tokens} prompt rows + {new_tokens} codes exceed the context "
                                 f"{self.context}")
            step = self._memo.setdefault("step", TTSHeadStep(self._bundle, context=self.context))
            _, gen = step.run_tokens(step.eager_runner(), step.encode(text, max_prompt_tokens), n_new=new_tokens)
            codes = [t for t in gen if t < self.cfg.eos_id]
            self._memo[key] = np.asarray([SILENCE_TOKEN] * 3 + codes, np.int64)
        return self._memo[key]

    def chunks(self, tokens):
        return schedule(self.prompt_tokens, tokens, self.cfg.chunk_tokens)

    def encode(self, chunks, run, record=None, outputs=None):
        runs = {self.P // 2: self.prompt_enc, self.cfg.chunk_tokens: run}
        keep = (lambda S, o: outputs(o) if S == self.cfg.chunk_tokens else None) if outputs else None
        rec = (lambda f: record(f) if f["emb"].shape[1] == self.cfg.chunk_tokens + 3 else None) if record else None
        return self.flow.encode_stream(runs, chunks, record=rec, outputs=keep)

    def exact_mu(self, text, opts) -> np.ndarray:
        key = ("mu", text, opts["max_prompt_tokens"], opts["new_tokens"])
        if key not in self._memo:
            ch = self.chunks(self.tokens(text, opts["max_prompt_tokens"], opts["new_tokens"]))
            _, seen = self.encode(ch, eager(self.enc_graph))
            f64 = self._memo.setdefault("flow64", copy.deepcopy(self.m.flow).double())
            self._memo[key] = self.flow.encode_full(ch, seen, f64)
        return self._memo[key]

    def mu_chunks(self, mu):
        P, N = self.P, self.cfg.chunk_frames
        return [mu[:, :P]] + [mu[:, s: s + N] for s in range(P, mu.shape[1], N)]

    def dit(self, mus, run, record=None, outputs=None):
        runs = {self.P: self.prompt_dit, self.cfg.chunk_frames: run}
        keep = (lambda F, o: outputs(o) if F == self.cfg.chunk_frames else None) if outputs else None
        rec = (lambda f: record(f) if f["x"].shape[-1] == self.cfg.chunk_frames else None) if record else None
        return self.flow.dit_stream(runs, mus, self.spk, self.prompt_mel, self.noise, record=rec, outputs=keep)

    def exact_mel(self, text, opts) -> np.ndarray:
        """The fp64 whole-utterance ODE on the fp64 mu (the generated frames, prompt dropped)."""
        key = ("mel", text, opts["max_prompt_tokens"], opts["new_tokens"])
        if key not in self._memo:
            mu = self.exact_mu(text, opts)
            mels, seen = self.dit([c.astype(np.float32) for c in self.mu_chunks(mu)], eager(self.dit_graph))
            est = self._memo.setdefault("dit64", copy.deepcopy(self.m.flow.decoder.estimator).double())
            full = self.flow.dit_full(est, mu, self.spk, self.prompt_mel, self.noise, [x.shape[1] for x in mels], seen)
            self._memo[key] = full[:, self.P:]
        return self._memo[key]


def speech_host(bundle, context: int) -> SpeechHost:
    """One host per bundle and context (the fp64 references it memoises are shared by the stages)."""
    hosts = bundle.__dict__.setdefault("_minicpmo_speech", {})
    if context not in hosts:
        hosts[context] = SpeechHost(bundle, context)
    return hosts[context]


def _stack(names, outs):
    return {n: np.concatenate([o[i] for o in outs]) for i, n in enumerate(names)}


class _Stage(Component):
    kind = "tensor"
    signal = ""          # the output handed to the next stage, judged against exact arithmetic

    def __init__(self, bundle, context: int, simulator_chunks: int | None = None):
        """``context``: the TTS head's context for the utterances' codes; ``simulator_chunks``: a bounded runtime
        traces one utterance only."""
        if simulator_chunks is not None and simulator_chunks < 1:
            raise ValueError(f"simulator_chunks must be >= 1, got {simulator_chunks}")
        self.host, self.cfg, self.simulator_chunks = speech_host(bundle, context), bundle.config, simulator_chunks
        self.graph = self.make_graph()
        self.module = self.graph.module

    def input_specs(self) -> list[TensorSpec]:
        return list(self.graph.inputs)

    def output_specs(self) -> list[TensorSpec]:
        return list(self.graph.outputs)

    def describe(self) -> dict:
        return {"name": self.name, "inputs": [[s.name, list(s.shape)] for s in self.input_specs()],
                "outputs": [[s.name, list(s.shape)] for s in self.output_specs()], "reference": self.reference_note,
                "prompt_frames": self.host.P, "simulator_chunks": self.simulator_chunks}

    def reference(self, prompts, opts) -> list[Sequence]:
        out = []
        for p in prompts.prompts:
            outs, signal = self.run(p, opts, eager(self.graph))
            seq = _stack([s.name for s in self.output_specs()], outs)
            seq[FLOOR + self.signal], seq[self.signal] = signal, self.exact(p, opts).reshape(signal.shape)
            seq["in.prompt"] = np.frombuffer(p.encode("utf-8"), np.uint8).copy()
            seq["in.opts"] = np.array([opts["max_prompt_tokens"], opts["new_tokens"]])
            out.append(Sequence([], 0, seq))
        return out

    def trace(self, run, reference, max_steps):
        """Whole utterances with ``run`` in the loop; a bounded runtime (``max_steps`` or ``simulator_chunks``)
        gets the first utterance only."""
        out = []
        bounded = max_steps is not None or self.simulator_chunks is not None
        for ref in reference[:1] if bounded else reference:
            text = ref.outputs["in.prompt"].tobytes().decode("utf-8")
            mp, nt = (int(x) for x in ref.outputs["in.opts"])
            outs, signal = self.run(text, {"max_prompt_tokens": mp, "new_tokens": nt}, run)
            seq = _stack([s.name for s in self.output_specs()], outs)
            seq[self.signal] = signal
            out.append(Sequence([], 0, seq))
        return out

    def calibration_feeds(self, prompts, opts):
        for p in prompts.prompts:
            feeds = []
            self.run(p, opts, eager(self.graph), record=lambda f: feeds.append({k: v.copy() for k, v in f.items()}))
            yield from feeds

    def calibration_steps(self, prompts, opts) -> int:
        return sum(1 for _ in self.calibration_feeds(prompts, opts))


class FlowEncoderComponent(_Stage):
    name, signal = "flow_encoder", "mu_utterance"
    reference_note = ("mu_utterance: the whole-utterance encoder in fp64 (the stream's block masks and trimmed "
                      "relative positions), eager fp32 stream beside it; caches: the eager fp32 chunk graph")

    def make_graph(self):
        return self.host.enc_graph

    def run(self, text, opts, run, record=None):
        h = self.host
        outs = []
        mus, _ = h.encode(h.chunks(h.tokens(text, opts["max_prompt_tokens"], opts["new_tokens"])), run, record,
                          outs.append)
        return outs, np.concatenate(mus[1:], axis=1).T        # [frames, 80]

    def exact(self, text, opts):
        return self.host.exact_mu(text, opts)[:, self.host.P:].T


class DiTStepComponent(_Stage):
    name, signal = "dit_step", "mel"
    reference_note = ("mel: the whole-utterance 10-step CFG Euler ODE in fp64 on the fp64 mu, same noise; v and "
                      "caches: the eager fp32 estimator step")

    def make_graph(self):
        return self.host.dit_graph

    def run(self, text, opts, run, record=None):
        h, outs = self.host, []
        mels, _ = h.dit([c.astype(np.float32) for c in h.mu_chunks(h.exact_mu(text, opts))], run, record,
                        outs.append)
        return outs, np.concatenate(mels[1:], axis=1).T

    def exact(self, text, opts):
        return self.host.exact_mel(text, opts).T


class HiFTComponent(_Stage):
    name, signal, kind = "hift", "audio", "audio"
    reference_note = ("audio: F0, NSF source and HiFT over the padded utterance in fp64 on the fp64 mel, same "
                      "noise table; F0 on the host in fp64")

    def make_graph(self):
        return hift_window(self.host.m, self.host.hift.W)

    def run(self, text, opts, run, record=None):
        mel = self.host.exact_mel(text, opts).astype(np.float32)
        outs = []

        def hift_run(feed):
            o = run(feed)
            outs.append(o)
            return o
        rec = (lambda kind, f: record(f) if kind == "hift" else None) if record else None
        audio, _ = self.host.hift.stream({"hift": hift_run}, mel, record=rec)
        return outs, audio

    def exact(self, text, opts):
        return self.host.hift.full_decode(self.host.exact_mel(text, opts).astype(np.float32))


COMPONENTS = {"tts_step": TTSHeadStep, "tts_prefill": TTSHeadPrefill, "flow_encoder": FlowEncoderComponent,
              "dit_step": DiTStepComponent, "hift": HiFTComponent}
