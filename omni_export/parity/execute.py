"""Executing an artifact over the fp32 reference: its trace (with a progress bar), the trace of each companion
runtime beside it (the QDQ source on ORT CPU beside the HTP simulator), and the figures of each against fp32 and
against each other. ``Pipeline`` keeps the result as a finished step keyed by the bytes executed."""
from __future__ import annotations

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .metrics import compare, snr_summary


def trace(comp, run, reference, budget, label: str, console):
    """``comp.trace`` of ``run`` over ``reference`` within ``budget`` graph calls, counting the calls on a bar."""
    total = sum(len(s.tokens) for s in reference) * (2 if comp.kind == "lm" else 1)
    total = total if budget is None else min(total, budget)
    prog = Progress(TextColumn("  {task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console, transient=True)
    with prog:
        task = prog.add_task(label, total=total)

        def counted(feed):
            out = run(feed)
            prog.advance(task)
            return out
        return comp.trace(counted, reference, budget)


def execute(comp, ex, reference, budget, console) -> dict:
    """``{"parity": figures against fp32, "three_way": SNR summaries}`` for the execution ``ex`` (parity None when
    no graph call completed within the budget, e.g. a component's simulator budget of 0)."""
    lm, kw = comp.kind == "lm", {"audio": comp.kind == "audio"}
    got = trace(comp, ex.run, reference, budget, f"{ex.runtime}", console)
    if not any(t.outputs for t in got):
        return {"parity": None, "three_way": {}}
    parity, three_way = compare(reference, got, lm, **kw), {}
    for cname, crun in ex.companions.items():
        ctrace = trace(comp, crun, reference, budget, cname, console)
        three_way[f"fp32 vs {cname}"] = snr_summary(compare(reference, ctrace, lm, **kw))
        three_way[f"{cname} vs {ex.runtime}"] = snr_summary(compare(ctrace, got, False))
        three_way[f"fp32 vs {ex.runtime}"] = snr_summary(parity)
    return {"parity": parity, "three_way": three_way}
