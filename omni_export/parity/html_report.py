"""One self-contained HTML page per run: PNG plots (matplotlib, Agg) embedded as data URIs and also written beside
the page, inline CSS, no network reference of any kind. Reads ``runs/<recipe>/<stamp>/report.json`` and the
manifests of the run's artifacts.

Sections: verdicts; per-component per-output SNR bars against the thresholds; LM agreement and three-way SNR
tables; the scheme sweep and per-layer sensitivity when the report carries them (``sweep``, ``sensitivity``);
artifact sizes; provenance (model hashes, recipe hash, calibration, toolchain, git SHA)."""
from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path

from matplotlib.figure import Figure

from ..artifacts.hashing import hash_value
from ..artifacts.store import SHELVES, atomic_dir, read_json
from ..errors import BadInput
from .report import headline

COLOURS = {"pass": "#2e7d32", "fail": "#c62828", "none": "#90a4ae", "threshold": "#212121"}
STATUS_CSS = {"pass": "pass", "blocked": "blocked", "unverified": "unverified"}
CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;margin:2em auto;max-width:1100px;
color:#1b1b1b;line-height:1.4;padding:0 1em}
h1{font-size:1.6em;margin-bottom:.2em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:.6em 0;font-size:.9em}th,td{border:1px solid #ddd;padding:.25em .6em;text-align:left}
th{background:#f5f5f5}td.num{text-align:right;font-variant-numeric:tabular-nums}
code{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.9em}
.badge{display:inline-block;padding:.05em .5em;border-radius:.3em;color:#fff;font-weight:600;font-size:.85em}
.pass{background:#2e7d32}.blocked{background:#c62828}.unverified{background:#ef6c00}
.muted{color:#666}img{max-width:100%;border:1px solid #eee;margin:.4em 0}ul.reasons{margin:.2em 0 .2em 1.2em;padding:0}
"""


# -- loading --------------------------------------------------------------------------------------
def find_runs(root: Path, recipe: str | None = None, run: str | None = None) -> list[tuple[Path, dict]]:
    """(run directory, report) pairs: ``run`` (a run directory or report.json) or the latest run of each recipe."""
    root = Path(root)
    if run:
        p = Path(run)
        p = p / "report.json" if p.is_dir() else p
        return [(p.parent, _read_json(p, "run report"))]
    recipes = [recipe] if recipe else sorted(d.name for d in (root / "runs").glob("*") if (d / "latest.json").is_file())
    out = []
    for r in recipes:
        latest = _read_json(root / "runs" / r / "latest.json", "run report")
        out.append((root / "runs" / r / str(latest.get("created")), latest))
    if not out:
        raise BadInput(f"store {root} has no runs (runs/<recipe>/latest.json); run `omni-export recipe NAME` first")
    return out


def _read_json(p: Path, what: str) -> dict:
    return read_json(p, what, lambda v: isinstance(v, dict) and "artifacts" in v and "recipe" in v)


def manifest_of(root: Path, report: dict, a: dict) -> dict | None:
    """The artifact's manifest where the run put it, or on another shelf if a later run moved it."""
    places = [Path(root) / a["location"]] + [Path(root) / s / report["recipe"]["name"] / a["id"] for s in SHELVES]
    for d in places:
        if (d / "manifest.json").is_file():
            try:
                return json.loads((d / "manifest.json").read_text())
            except (OSError, ValueError):
                return None
    return None


# -- plots ----------------------------------------------------------------------------------------
def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return buf.getvalue()


def _bound_value(bound: str) -> float:
    return float(bound.split()[-1])  # gate.Threshold.bound: ">= 45" / "<= 0.001"


def _component(a: dict, m: dict | None) -> str:
    return ((m or {}).get("artifact", {}).get("component") or {}).get("name") or a["id"].split(".")[0]


def snr_plot(component: str, arts: list[dict]) -> bytes:
    """One panel per artifact: SNR per output, green/red by its check, the threshold drawn over each bar."""
    fig = Figure(figsize=(10, 2.4 * len(arts) + 0.6))
    axes = fig.subplots(len(arts), 1, squeeze=False)[:, 0]
    for ax, a in zip(axes, arts):
        outs = ((a.get("parity") or {}).get("outputs")) or {}
        ax.set_title(f"{a['id']}  [{a['status']}]", loc="left", fontsize=10)
        if not outs:
            ax.text(0.5, 0.5, f"{a['status']}: not measured\n" + "; ".join(a.get("reasons") or [])[:120],
                    ha="center", va="center", transform=ax.transAxes, fontsize=9)
            ax.set_axis_off()
            continue
        checks = {c["output"]: c for c in a.get("checks") or [] if c["metric"] == "snr_db"}
        names = list(outs)
        vals = [outs[n]["snr_db"] for n in names]
        colours = [COLOURS["none"] if n not in checks else COLOURS["pass" if checks[n]["ok"] else "fail"] for n in names]
        xs = range(len(names))
        ax.bar(xs, vals, color=colours, width=0.7)
        for x, n in zip(xs, names):
            if n in checks:
                ax.hlines(_bound_value(checks[n]["bound"]), x - 0.45, x + 0.45, colors=COLOURS["threshold"],
                          linewidth=2)
        for x, v in zip(xs, vals):
            ax.text(x, v, f"{v:.1f}", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(list(xs), names, fontsize=8, rotation=30 if len(names) > 8 else 0)
        ax.set_ylabel("SNR vs fp32 (dB)", fontsize=8)
        ax.set_ylim(min(0.0, min(vals) * 1.1), max(max(vals), *(_bound_value(c["bound"]) for c in checks.values()))
                    * 1.15 if checks else max(vals) * 1.15)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"{component}: SNR per output (bars) against the threshold (black line); grey = no threshold",
                 fontsize=10)
    fig.tight_layout()
    return _png(fig)


def size_plot(arts: list[dict]) -> bytes:
    fig = Figure(figsize=(10, 0.5 * len(arts) + 1.2))
    ax = fig.subplots()
    mb = [a.get("size_bytes", 0) / 1e6 for a in arts]
    ax.barh(range(len(arts)), mb, color="#1565c0")
    ax.set_yticks(range(len(arts)), [a["id"] for a in arts], fontsize=8)
    ax.invert_yaxis()
    for y, v in enumerate(mb):
        ax.text(v, y, f" {v:.2f} MB", va="center", fontsize=8)
    ax.set_xlabel("MB on disk (all files of the artifact)", fontsize=8)
    ax.set_xlim(0, max(mb + [0.001]) * 1.25)
    fig.tight_layout()
    return _png(fig)


def rows_of(value) -> list[dict]:
    """Normalise a ``sweep`` / ``sensitivity`` value to rows: a list of dicts, a dict holding one (``rows`` as the
    sweep writes it, ``layers`` as calibration.sensitivity writes it), or a mapping label -> number / dict."""
    if isinstance(value, list):
        return [r for r in value if isinstance(r, dict)]
    if isinstance(value, dict):
        for key in ("rows", "layers"):
            if isinstance(value.get(key), list):
                return rows_of(value[key])
        return [{"name": k, **(v if isinstance(v, dict) else {"value": v})} for k, v in value.items()]
    return []


LABEL_KEYS = ("scheme", "component", "layer", "name")


def _series(rows: list[dict]) -> list[str]:
    """Numeric columns (None allowed), SNR-like ones first."""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    nums = [k for k in keys if any(r.get(k) is not None for r in rows) and all(
        r.get(k) is None or (isinstance(r.get(k), (int, float)) and not isinstance(r.get(k), bool)) for r in rows)]
    return sorted(nums, key=lambda k: ("snr" not in k.lower(), keys.index(k)))


def rows_plot(rows: list[dict], title: str) -> bytes | None:
    """Grouped bars of up to three SNR-like series (or the first numeric one) per row; None when nothing is numeric."""
    series = _series(rows)
    snr = [k for k in series if "snr" in k.lower()][:3] or series[:1]
    if not snr:
        return None
    labels = [" / ".join(str(r[k]) for k in LABEL_KEYS if isinstance(r.get(k), str)) or str(i)
              for i, r in enumerate(rows)]
    fig = Figure(figsize=(10, 4.2 if len(rows) > 6 else 3.6))  # the page's width: fonts stay readable
    ax = fig.subplots()
    width = 0.8 / len(snr)
    for j, key in enumerate(snr):
        xs = [i + (j - (len(snr) - 1) / 2) * width for i in range(len(rows))]
        ax.bar(xs, [r.get(key) if r.get(key) is not None else 0 for r in rows], width=width, label=key)
    ax.set_xticks(range(len(rows)), labels, fontsize=7, rotation=90 if len(rows) > 6 else 0)
    ax.set_ylabel("dB" if "snr" in snr[0].lower() else snr[0], fontsize=8)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="lower left")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return _png(fig)


def extras(root: Path, report: dict) -> dict[str, object]:
    """``sweep`` and ``sensitivity`` for the page: from the report itself, else what ``omni-export sweep`` wrote
    under the run's recipe (``runs/<recipe>/<stamp>/sweep.json``, ``runs/<recipe>/sensitivity/*.json``)."""
    runs = Path(root) / "runs" / report["recipe"]["name"]
    out = {}
    sweeps = sorted(runs.glob("*/sweep.json"))
    sweep = report.get("sweep") or (json.loads(sweeps[-1].read_text()).get("sweep") if sweeps else None)
    if sweep:
        out["sweep"] = sweep
    sens = report.get("sensitivity") or {p.stem: json.loads(p.read_text()) for p in sorted(runs.glob("sensitivity/*.json"))}
    if sens:
        out["sensitivity"] = sens
    return out


# -- the page -------------------------------------------------------------------------------------
def _e(v) -> str:
    return html.escape("-" if v is None else str(v))


def _num(v, nd=2) -> str:
    return "-" if v is None else (f"{v:.{nd}f}" if isinstance(v, float) else _e(v))


def _table(headers: list[str], rows: list[list[str]], numeric: set[int] = frozenset()) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td class=\"num\">{c}</td>" if i in numeric else f"<td>{c}</td>"
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _img(name: str, png: bytes, alt: str) -> str:
    return f'<img src="data:image/png;base64,{base64.b64encode(png).decode()}" alt="{_e(alt)}" title="{_e(name)}">'


def build_page(report: dict, manifests: dict[str, dict | None]) -> tuple[str, dict[str, bytes]]:
    """(HTML text, {png file name: bytes}) for one run report and its artifacts' manifests (id -> manifest)."""
    arts = report["artifacts"]
    rname = report["recipe"]["name"]
    plots: dict[str, bytes] = {}
    parts = [f"<h1>omni-export <code>{_e(rname)}</code></h1>",
             f"<p class=\"muted\">{_e(report['recipe'].get('description'))}<br>run {_e(report.get('created'))}, "
             f"device {_e(report['device'].get('display'))}, model {_e(report['model'].get('family'))} "
             f"({_e(report['model'].get('source'))}), exit code {_e(report.get('exit_code'))}</p>"]

    rows = []
    for a in arts:
        h = headline(a)
        reasons = "".join(f"<li>{_e(r)}</li>" for r in a.get("reasons") or [])
        rows.append([f"<code>{_e(a['id'])}</code>", _e(a.get("runtime")), _num(h["steps"]), _num(h["main_snr"], 1),
                     _num(h["others_min"], 1), _num(h["top1"], 3), _num(h["greedy"], 3),
                     f"<span class=\"badge {STATUS_CSS.get(a['status'], 'blocked')}\">{_e(a['status'].upper())}</span>"
                     + (f"<ul class=\"reasons\">{reasons}</ul>" if reasons else "")])
    parts += ["<h2>Verdicts</h2>", _table(["artifact", "runtime", "steps", "logits dB", "K/V rows min dB",
                                            "top-1 (teacher-forced)", "greedy", "verdict"], rows, {2, 3, 4, 5, 6})]

    parts.append("<h2>SNR per output against the thresholds</h2>")
    by_comp: dict[str, list[dict]] = {}
    for a in arts:
        by_comp.setdefault(_component(a, manifests.get(a["id"])), []).append(a)
    for comp, comp_arts in by_comp.items():
        name = f"snr_{comp}.png"
        plots[name] = snr_plot(comp, comp_arts)
        parts.append(_img(name, plots[name], f"SNR per output of {comp}"))
    th_rows = []
    for a in arts:
        for t in (manifests.get(a["id"]) or {}).get("thresholds") or []:
            bound = f">= {t['min']:g}" if "min" in t else f"<= {t['max']:g}"
            th_rows.append([f"<code>{_e(a['id'])}</code>", _e(t["metric"]), f"<code>{_e(t.get('outputs', '*'))}</code>",
                            _e(bound), _e(t.get("reason"))])
    if th_rows:
        parts += ["<details><summary>Thresholds and why they have their values</summary>",
                  _table(["artifact", "metric", "outputs", "bound", "reason"], th_rows), "</details>"]

    lm_rows = [[f"<code>{_e(a['id'])}</code>", _num(lm.get("top1_agreement"), 3), _e(lm.get("top1_positions")),
                _num(lm.get("greedy_agreement"), 3), _e(lm.get("greedy_positions")), _num(lm.get("max_logprob_delta"), 5)]
               for a in arts for lm in [((a.get("parity") or {}).get("lm"))] if lm]
    if lm_rows:
        parts += ["<h2>Token agreement</h2>",
                  _table(["artifact", "top-1 (TF)", "positions", "greedy", "positions", "max |dlogp|"], lm_rows,
                         {1, 2, 3, 4, 5})]
    tw_rows = [[f"<code>{_e(a['id'])}</code>", _e(pair), ", ".join(f"{_e(k)} {v:.1f} dB" for k, v in d.items())]
               for a in arts for pair, d in (a.get("three_way_snr_db") or {}).items()]
    if tw_rows:
        parts += ["<h2>Three-way SNR (simulator)</h2>", _table(["artifact", "comparison", "SNR"], tw_rows)]

    sens = report.get("sensitivity")
    per_graph = (sens if isinstance(sens, dict) and sens and all(isinstance(v, dict) and "layers" in v
                                                                 for v in sens.values()) else {"": sens})
    sections = [("sweep", "Scheme sweep", report.get("sweep"))]
    sections += [(f"sensitivity{'_' + k if k else ''}", f"Per-layer sensitivity {k}".strip(), v)
                 for k, v in per_graph.items()]
    for key, title, value in sections:
        rows_ = rows_of(value)
        if not rows_:
            continue
        parts.append(f"<h2>{_e(title)}</h2>")
        png = rows_plot(rows_, title)
        if png:
            plots[f"{key}.png"] = png
            parts.append(_img(f"{key}.png", png, title))
        cols = list(dict.fromkeys(k for r in rows_ for k in r))
        tab = _table(cols, [[_num(r.get(c), 3) if isinstance(r.get(c), float) else _e(r.get(c)) for c in cols]
                            for r in rows_])
        parts.append(tab if len(rows_) <= 12 else f"<details><summary>{len(rows_)} rows</summary>{tab}</details>")

    parts.append("<h2>Artifact sizes</h2>")
    plots["sizes.png"] = size_plot(arts)
    parts.append(_img("sizes.png", plots["sizes.png"], "artifact sizes"))
    f_rows = [[f"<code>{_e(a['id'])}</code>", f"<code>{_e(fn)}</code>", _e(meta.get("role")),
               f"{meta.get('bytes', 0):,}", f"<code>{_e(meta.get('sha256', '')[:16])}…</code>"]
              for a in arts for fn, meta in ((manifests.get(a["id"]) or {}).get("artifact", {}).get("files") or {}).items()]
    if f_rows:
        parts.append(_table(["artifact", "file", "role", "bytes", "sha256"], f_rows, {3}))

    parts.append("<h2>Provenance</h2>")
    model = report["model"]
    m0 = next((m for m in manifests.values() if m), {}) or {}
    rev = m0.get("source_revision") or {}
    prov = [["recipe", f"<code>{_e(rname)}</code> hash <code>{_e(hash_value(report['recipe'])[:16])}…</code>"],
            ["model", f"{_e(model.get('family'))}: {_e(model.get('source'))}"],
            ["config sha256", f"<code>{_e(model.get('config_hash'))}</code>"],
            ["weights sha256", f"<code>{_e(model.get('weights_hash'))}</code>"],
            ["device", _e(report["device"].get("display")) + f" (<code>{_e(report['device'].get('chipset'))}</code>)"],
            ["omni-export git SHA", f"<code>{_e(rev.get('sha'))}</code>" + (" (dirty)" if rev.get("dirty") else "")]]
    for comp, cal in (report.get("calibration") or {}).items():
        prov.append([f"calibration {_e(comp)}", f"<code>{_e(cal.get('hash'))}</code>, {_e(cal.get('samples'))} samples"])
    parts.append(_table(["what", "value"], prov))
    tc = m0.get("toolchain") or {}
    if tc:
        parts.append(_table(["package", "version"], [[_e(k), f"<code>{_e(v)}</code>"] for k, v in tc.items()]))
    tim = report.get("timings_s") or {}
    if tim:
        rss = report.get("peak_rss_bytes") or {}
        rows = [[_e(k), _num(float(v), 1), _num(rss[k] / 2**30, 2) if k in rss else "-"] for k, v in tim.items()]
        parts += ["<details><summary>Timings and peak memory</summary>",
                  _table(["stage", "seconds", "peak RSS (GiB)"], rows, {1, 2}), "</details>"]
    missing = [a["id"] for a in arts if manifests.get(a["id"]) is None]
    if missing:
        parts.append(f"<p class=\"muted\">No manifest found for: {_e(', '.join(missing))} (removed from the store).</p>")

    page = ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>omni-export {_e(rname)} {_e(report.get('created'))}</title><style>{CSS}</style></head>"
            "<body>\n" + "\n".join(parts) + "\n</body></html>\n")
    return page, plots


def render_run(root: Path, run_dir: Path, report: dict, out: Path | None = None) -> Path:
    """Write report.html and its PNGs into ``out`` (default ``<run_dir>/html``) in one atomic step."""
    manifests = {a["id"]: manifest_of(root, report, a) for a in report["artifacts"]}
    page, plots = build_page({**report, **extras(root, report)}, manifests)
    out = Path(out) if out else Path(run_dir) / "html"
    with atomic_dir(out) as tmp:
        (tmp / "report.html").write_text(page, encoding="utf-8")
        for name, png in plots.items():
            (tmp / name).write_bytes(png)
    return out / "report.html"


def render_store(root: Path, recipe: str | None = None, run: str | None = None, out: Path | None = None) -> list[Path]:
    runs = find_runs(root, recipe, run)
    pages = []
    for run_dir, report in runs:
        dest = (out / report["recipe"]["name"]) if (out and len(runs) > 1) else out
        pages.append(render_run(root, run_dir, report, dest))
    return pages
