"""Executing an artifact over the fp32 reference: its trace (with a progress bar), the trace of each companion
runtime beside it (the QDQ source on ORT CPU beside the HTP simulator), and the figures of each against fp32 and
against each other. ``Pipeline`` keeps the result as a finished step keyed by the bytes executed."""
from __future__ import annotations

import gc
import hashlib

import numpy as np
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .metrics import compare, compared_steps, log_softmax, snr_db, snr_summary

WHOLE_BYTES = 1 << 18  # a call's input array up to this size is fingerprinted whole, a larger one by a sample


def trace(comp, run, reference, budget, label: str, console, forced_only: bool = False):
    """``comp.trace`` of ``run`` over ``reference`` within ``budget`` graph calls, counting the calls on a bar; with
    ``forced_only``, its teacher-forced calls only (``Component.supports_forced_only``)."""
    if forced_only and not comp.supports_forced_only:
        raise TypeError(f"{type(comp).__name__}'s trace cannot stop after its teacher-forced calls")
    total = sum(len(s.tokens) for s in reference) * (2 if comp.kind == "lm" and not forced_only else 1)
    total = total if budget is None else min(total, budget)
    prog = Progress(TextColumn("  {task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console, transient=True)
    with prog:
        task = prog.add_task(label, total=total)

        def counted(feed):
            out = run(feed)
            prog.advance(task)
            return out
        return comp.trace(counted, reference, budget, **({"forced_only": True} if forced_only else {}))


def _fingerprint(arrays: dict[str, np.ndarray]) -> str:
    """Names, shapes and values of a call's inputs (a large array by its sum and every 997th value: enough to tell
    two different calls apart, cheap at full size where a call's caches are ~70 MB)."""
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}{a.shape}{a.dtype}".encode())
        h.update(a.tobytes() if a.nbytes <= WHOLE_BYTES else a.reshape(-1)[::997].tobytes() + a.sum(dtype=np.float64).tobytes())
    return h.hexdigest()


def part_major(comp, parts, chain, reference, budget, label: str, console):
    """``trace`` of a chain of graphs with one graph's session open at a time, the same calls and outputs as the chain.

    The teacher-forced calls (``trace(..., forced_only=True)``) are made graph by graph: graph k runs every call with its
    inputs from the feed and from graphs 0..k-1's recorded outputs of the same call; the outputs of the graphs after
    it are zeros, which only fill caches those graphs are not run on in this pass. Every graph's own caches are
    written from its own real outputs, so each gets exactly the inputs the chain would give it (checked call by
    call when the trace is replayed). The full trace then replays the recorded calls, in the same order, and runs
    any further call (a free run that leaves fp32's tokens) on the whole chain, whose sessions open only then."""
    graphs, names = comp.graphs(), [s.name for s in comp.output_specs()]
    shapes = {s.name: s.shape for s in comp.output_specs()}
    records, prints = [], []
    for g in graphs:
        session, rec, fp = parts[g.name](), [], []

        def one(feed, g=g, session=session, rec=rec, fp=fp):
            env, i = dict(feed), len(rec)
            for r in records:
                env.update(r[i])
            fp.append(_fingerprint({s.name: feed[s.name] for s in g.inputs if s.name in feed}))
            rec.append(dict(zip((s.name for s in g.outputs), session({s.name: env[s.name] for s in g.inputs}))))
            env.update(rec[-1])
            return [env[n] if n in env else np.zeros(shapes[n], np.float32) for n in names]
        trace(comp, one, reference, budget, f"{label} ({g.name})", console, forced_only=True)
        records.append(rec)
        prints.append(fp)
        del session, one
        gc.collect()
    calls = iter(range(1 << 62))

    def replay(feed):
        i = next(calls)
        if i >= len(records[0]):
            return chain(feed)
        env = dict(feed)
        for g, rec, fp in zip(graphs, records, prints):
            if _fingerprint({s.name: feed[s.name] for s in g.inputs if s.name in feed}) != fp[i]:
                raise RuntimeError(f"parity call {i}: {g.name}'s inputs differ from its one-graph pass")
            env.update(rec[i])
        return [np.array(env[n]) for n in names]
    return trace(comp, replay, reference, budget, label, console)


def _traced(comp, run, parts, reference, budget, label: str, console):
    """``part_major`` where the runtime can open the graphs one at a time and the trace allows it, else ``trace``."""
    if parts and comp.supports_forced_only:
        return part_major(comp, parts, run, reference, budget, label, console)
    return trace(comp, run, reference, budget, label, console)


def execute(comp, ex, reference, budget, console) -> dict:
    """``{"parity": figures against fp32, "three_way": SNR summaries}`` for the execution ``ex`` (parity None when
    no graph call completed within the budget, e.g. a component's simulator budget of 0). A chain of graphs whose
    runtime can open them one at a time (``ex.parts``, ``ex.companion_parts``) and whose trace allows it runs
    ``part_major``."""
    lm, kw = comp.kind == "lm", {"audio": comp.kind == "audio", "first_step": comp.parity_first_step}
    got = (ex.trace(reference, budget) if getattr(ex, "trace", None) is not None
           else _traced(comp, ex.run, ex.parts, reference, budget, f"{ex.runtime}", console))
    if not compared_steps(got, comp.parity_first_step):
        return {"parity": None, "three_way": {}}
    gen = generated(ex.generate, reference, got) if ex.generate is not None and lm else None
    parity, three_way = compare(reference, got, lm, **kw), {}
    if gen is not None:
        parity["generator"] = gen
    for cname, crun in ex.companions.items():
        ctrace = _traced(comp, crun, ex.companion_parts.get(cname), reference, budget, cname, console)
        three_way[f"fp32 vs {cname}"] = snr_summary(compare(reference, ctrace, lm, **kw))
        three_way[f"{cname} vs {ex.runtime}"] = snr_summary(compare(ctrace, got, False,
                                                                      first_step=comp.parity_first_step))
        three_way[f"fp32 vs {ex.runtime}"] = snr_summary(parity)
    return {"parity": parity, "three_way": three_way}


FIRST_TOKENS = 4  # generated tokens per parity prompt past the traced ones, in the generating runtime


def generated(generate, reference, got) -> dict:
    """The free-running greedy ids of ``got``'s sequences from the target's own generating runtime (``Execution.
    generate``, e.g. a Genie dialog), in place of the step runner's, and the first ``FIRST_TOKENS`` generated tokens
    of every parity prompt the step budget did not reach (the first generated position is the one a bundle's prompt
    program computes: the weakest measured in Genie, docs/deploy.md); returns what that runtime measured: its logits
    at every generated position while its ids follow fp32's, against fp32's logits there, and its refusal text. A
    runtime that refused generates nothing, so its greedy figures are unmeasured and fail closed."""
    n_new = [len(r.generated) if i < len(got) else min(len(r.generated), FIRST_TOKENS) for i, r in enumerate(reference)]
    res = generate([r.tokens[:r.n_prompt] for r in reference], n_new)
    ref_rows, test_rows = [], []
    stopped = res.get("stopped") or [False] * len(reference)  # the runtime ended a free run at its own EOS id
    for i, (r, ids, rows, eos) in enumerate(zip(reference, res["ids"], res["logits"], stopped)):
        if i < len(got):  # a traced sequence: its greedy figures are the runtime's free run
            got[i].generated, got[i].stopped_at_eos = list(ids), bool(eos)
        if rows is None:
            continue
        n = min(len(rows), n_new[i], len(r.outputs["logits"]) - (r.n_prompt - 1))
        same = next((j for j in range(n) if ids[j] != r.generated[j]), n - 1) + 1  # up to the first divergence
        lr = r.outputs["logits"][r.n_prompt - 1: r.n_prompt - 1 + min(same, n)]
        ref_rows.append(lr.reshape(len(lr), -1))
        test_rows.append(np.asarray(rows[:len(lr)], np.float32).reshape(len(lr), -1))
    out = {"refused": res.get("refused"), "positions": int(sum(len(x) for x in ref_rows)),
           "prompts": len(ref_rows), "new_tokens": n_new}
    if any(stopped):
        out["stopped_at_eos"] = [i for i, s in enumerate(stopped) if s]
    if out["positions"]:
        ref, test = np.concatenate(ref_rows), np.concatenate(test_rows)
        lr, lt = log_softmax(ref), log_softmax(test)
        tg = lr.argmax(-1)
        out.update(logits_snr_db=round(snr_db(ref, test), 3),
                   top1_agreement=round(float(np.mean(lt.argmax(-1) == tg)), 4),
                   max_logprob_delta=float(np.max(np.abs(lt[np.arange(len(tg)), tg] - lr[np.arange(len(tg)), tg]))))
    return out
