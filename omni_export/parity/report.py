"""Human-readable summaries of a run report: a terminal table (rich) and markdown (tabulate)."""
from __future__ import annotations

from rich.table import Table
from tabulate import tabulate

from . import texts
from .gate import SKIPPED, check_status
from .texts import greedy_texts  # noqa: F401 (the pipeline's one import of the report helpers)


def _fmt(v, nd=1):
    if v is None:
        return "-"
    return f"{v:.{nd}f}" if isinstance(v, float) else str(v)


def _kld(v) -> str:
    return "-" if v is None else f"{v:.2e}"


def headline(a: dict) -> dict:
    """The few figures a person reads first for one artifact."""
    p = a.get("parity") or {}
    outs = p.get("outputs") or {}
    lm = p.get("lm") or {}
    rest = [v["snr_db"] for k, v in outs.items() if k != "logits"]
    first = "logits" if "logits" in outs else (next(iter(outs)) if outs else None)
    return {"main_snr": outs.get(first, {}).get("snr_db") if first else None, "main": first,
            "others_min": min(rest) if rest else None, "top1": lm.get("top1_agreement"),
            "greedy": lm.get("greedy_agreement"), "dlogp": lm.get("max_logprob_delta"), "steps": p.get("steps"),
            "kld": lm.get("kld_mean")}


def skipped_checks(a: dict) -> list[dict]:
    """The checks of an artifact's verdict that were recorded, not enforced (``parity.gate``: skipped, never passed)."""
    return [c for c in a.get("checks") or [] if isinstance(c, dict) and check_status(c) == SKIPPED]


def skipped_note(a: dict) -> str:
    n = len(skipped_checks(a))
    return f" ({n} check{'s' if n > 1 else ''} skipped, not enforced)" if n else ""


def _skipped_line(c: dict) -> str:
    why = c.get("skipped") or c.get("not_enforced") or "recorded, not enforced"
    return f"{c.get('output')} {c.get('metric')} = {_fmt(c.get('value'), 4)} (bound {c.get('bound')}): {why}"


def table(report: dict) -> Table:
    t = Table(title=f"omni-export {report['recipe']['name']}: parity against eager fp32", show_lines=False)
    for c in ("artifact", "runtime", "steps", "logits dB", "K/V rows min dB", "top-1 (TF)", "KLD mean", "greedy",
              "max |dlogp|", "verdict"):
        t.add_column(c, overflow="fold")
    for a in report["artifacts"]:
        h = headline(a)
        colour = {"pass": "green", "blocked": "red", "unverified": "yellow"}[a["status"]]
        verdict = a["status"].upper() + skipped_note(a) + \
            ("" if a["status"] == "pass" else ": " + "; ".join(a["reasons"][:2]))
        t.add_row(a["id"], a["runtime"] or "-", _fmt(h["steps"]), _fmt(h["main_snr"]), _fmt(h["others_min"]),
                  _fmt(h["top1"], 3), _kld(h["kld"]), _fmt(h["greedy"], 3), _fmt(h["dlogp"], 4),
                  f"[{colour}]{verdict}[/]")
    return t


def text_table(report: dict) -> Table | str | None:
    """fp32's and each artifact's greedy text per parity prompt (``parity.texts``); a note without a tokenizer."""
    gt = report.get("greedy_text")
    if gt and gt.get("tokenizer") is None:
        return gt.get("note")
    rows = texts.rows(gt)
    if not rows:
        return None
    t = Table(title="greedy text against fp32 (first diverging token in \u27e6 \u27e7)")
    for c in ("component", "prompt", "fp32 / artifact", "agreed", "text"):
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(*r)
    return t


def md_table(headers: list[str], rows: list[list]) -> str:
    """A GitHub-flavoured markdown table (``tabulate``); cells are written as given (no number reformatting)."""
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def markdown_summary(report: dict) -> str:
    rows = []
    for a in report["artifacts"]:
        h = headline(a)
        verdict = ("**PASS**" if a["status"] == "pass" else f"**{a['status'].upper()}**: " + "; ".join(a["reasons"])) \
            + skipped_note(a)
        rows.append([f"`{a['id']}`", a["runtime"] or "-", _fmt(h["steps"]), _fmt(h["main_snr"]), _fmt(h["others_min"]),
                     _fmt(h["top1"], 3), _kld(h["kld"]), _fmt(h["greedy"], 3), verdict.replace("|", "\\|")])
    lines = [f"## omni-export `{report['recipe']['name']}`", "",
             f"Model: {report['model']['family']} ({report['model']['source']}), device {report['device']['display']}", "",
             md_table(["artifact", "runtime", "steps", "logits dB", "K/V rows min dB", "top-1 (TF)", "KLD mean", "greedy",
                       "verdict"],
                      rows)]
    tw = [(a["id"], a["three_way_snr_db"]) for a in report["artifacts"] if a.get("three_way_snr_db")]
    if tw:
        lines += ["", "Three-way SNR (dB):", ""]
        for aid, d in tw:
            for k, v in d.items():
                lines.append(f"- `{aid}` {k}: " + ", ".join(f"{n} {x:.1f}" for n, x in v.items()))
    skipped = [(a["id"], c) for a in report["artifacts"] for c in skipped_checks(a)]
    if skipped:
        lines += ["", "Checks recorded but not enforced (skipped, not passed):", ""]
        lines += [f"- `{aid}` {_skipped_line(c)}" for aid, c in skipped]
    lines += texts.markdown(report.get("greedy_text"))
    lines += ["", "Thresholds and their reasons are in each artifact's manifest.json.", ""]
    return "\n".join(lines)
