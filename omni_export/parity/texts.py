"""fp32's and each artifact's greedy text per parity prompt, side by side, decoded with the checkpoint's tokenizer,
the first diverging token marked (terminal, markdown and HTML run reports)."""
from __future__ import annotations

import itertools

MARK = ("\u27e6", "\u27e7")  # the first token where an artifact's greedy text leaves fp32's: ⟦token⟧


def greedy_texts(report: dict, tokenizer) -> dict | None:
    """``report["greedy_text"]``: per parity prompt of each LM component, fp32's greedy text and every artifact's,
    as (agreed prefix, first diverging token, rest) strings. No tokenizer: a note saying so and no text."""
    if not any(((a.get("parity") or {}).get("lm") or {}).get("greedy_ids") for a in report["artifacts"]):
        return None
    if tokenizer is None:
        return {"tokenizer": None, "note": "the checkpoint has no tokenizer: greedy token ids only (parity.lm)"}

    def dec(ids) -> str:
        """The ids' text; a negative id (a runner's piece no token id names: ``llm_runner.pieces_to_ids``) as
        ``<id N>``: the tokenizer decodes runs of real ids (pieces of one character may span tokens)."""
        return "".join(tokenizer.decode(list(run)) if real else "".join(f"<id {i}>" for i in run)
                       for real, run in itertools.groupby(map(int, ids), key=lambda i: i >= 0))

    comps: dict[str, dict] = {}
    for a in report["artifacts"]:
        lm = (a.get("parity") or {}).get("lm") or {}
        if not lm.get("greedy_ids"):
            continue
        comp = a["id"].split(".")[0]
        c = comps.setdefault(comp, {"fp32": [dec(g) for g in lm["fp32_greedy_ids"]], "artifacts": {}})
        rows = []
        for ref, got in zip(lm["fp32_greedy_ids"], lm["greedy_ids"]):
            n = next((i for i, (x, y) in enumerate(zip(ref, got)) if x != y), min(len(ref), len(got)))
            rows.append({"agree": n, "of": len(ref), "same": dec(got[:n]),
                         "first": dec(got[n:n + 1]) if n < len(got) else "", "rest": dec(got[n + 1:])})
        c["artifacts"][a["id"]] = rows
    return {"tokenizer": getattr(tokenizer, "name", None), "tokenizer_hash": getattr(tokenizer, "hash", None),
            "components": comps}


def marked(row: dict) -> str:
    return row["same"] + (f"{MARK[0]}{row['first']}{MARK[1]}{row['rest']}" if row["first"] else "")


def markdown(gt: dict | None) -> list[str]:
    if not gt:
        return []
    lines = ["", "### Greedy text: fp32 and each artifact (first diverging token in \u27e6 \u27e7)", ""]
    if gt.get("tokenizer") is None:
        return lines + [gt.get("note", ""), ""]
    for comp, c in gt["components"].items():
        for i, ref in enumerate(c["fp32"]):
            lines += [f"**{comp}, prompt {i}** - fp32: `{ref!r}`", ""]
            lines += [f"- `{aid}` ({rows[i]['agree']}/{rows[i]['of']}): `{marked(rows[i])!r}`"
                      for aid, rows in c["artifacts"].items() if i < len(rows)]
            lines.append("")
    return lines


def rows(gt: dict | None) -> list[list[str]]:
    """[component, prompt, who, agreed/of, text] rows for the terminal and HTML tables."""
    if not gt or gt.get("tokenizer") is None:
        return []
    out = []
    for comp, c in gt["components"].items():
        for i, ref in enumerate(c["fp32"]):
            out.append([comp, str(i), "fp32", "-", ref])
            out += [[comp, str(i), aid, f"{r[i]['agree']}/{r[i]['of']}", marked(r[i])]
                    for aid, r in c["artifacts"].items() if i < len(r)]
    return out


def html_rows(gt: dict | None) -> list[list]:
    """``rows`` for the HTML page: the first diverging token in ``<mark>``, every text escaped."""
    from markupsafe import Markup, escape

    if not gt or gt.get("tokenizer") is None:
        return []
    out = []
    for comp, c in gt["components"].items():
        for i, ref in enumerate(c["fp32"]):
            out.append([comp, str(i), "fp32", "-", escape(ref)])
            for aid, r in c["artifacts"].items():
                if i < len(r):
                    x = r[i]
                    cell = escape(x["same"]) + (Markup("<mark>%s</mark>") % x["first"] + escape(x["rest"])
                                                if x["first"] else "")
                    out.append([comp, str(i), aid, f"{x['agree']}/{x['of']}", Markup(cell)])
    return out
