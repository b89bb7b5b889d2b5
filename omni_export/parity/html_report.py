"""One self-contained HTML page per run, rendered from a Jinja2 template (``templates/report.html.j2``, autoescaped,
shipped as package data): PNG plots (``html_plots``) embedded as data URIs and also written beside the page, inline
CSS, no network reference of any kind. Reads ``runs/<recipe>/<stamp>/report.json`` and the manifests of the run's
artifacts.

Sections: verdicts; per-component per-output SNR bars against the thresholds; LM agreement and three-way SNR
tables; the scheme sweep and per-layer sensitivity when the report carries them (``sweep``, ``sensitivity``);
artifact sizes; provenance (model hashes, recipe hash, calibration, toolchain, git SHA)."""
from __future__ import annotations

import base64
import functools
import json
import os
import stat
from pathlib import Path

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markupsafe import Markup

from ..artifacts.hashing import hash_value
from ..artifacts.store import SHELVES, atomic_dir, read_json
from ..errors import BadInput
from .html_plots import _component, rows_of, rows_plot, size_plot, snr_plot
from .report import _skipped_line, headline, skipped_checks, skipped_note
from .texts import html_rows as texts_rows

STATUS_CSS = {"pass": "pass", "blocked": "blocked", "unverified": "unverified"}


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


# -- the page ------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _template():
    env = Environment(loader=PackageLoader("omni_export.parity", "templates"), autoescape=select_autoescape(["j2"]),
                      undefined=StrictUndefined, trim_blocks=False, keep_trailing_newline=True)
    return env.get_template("report.html.j2")


def code(v) -> Markup:
    return Markup("<code>{}</code>").format("-" if v is None else v)


def _num(v, nd=2) -> str:
    return "-" if v is None else (f"{v:.{nd}f}" if isinstance(v, float) else str(v))


def _plot(plots: dict, name: str, png: bytes, alt: str) -> dict:
    plots[name] = png
    return {"name": name, "alt": alt, "b64": base64.b64encode(png).decode()}


def _verdict_cell(a: dict) -> Markup:
    badge = Markup('<span class="badge {}">{}</span>').format(STATUS_CSS.get(a["status"], "blocked"), a["status"].upper())
    badge += Markup('<span class="muted">{}</span>').format(skipped_note(a)) if skipped_checks(a) else Markup("")
    reasons = Markup("").join(Markup("<li>{}</li>").format(r) for r in a.get("reasons") or [])
    return badge + (Markup('<ul class="reasons">{}</ul>').format(reasons) if reasons else Markup(""))


def _sections(report: dict, plots: dict) -> list[dict]:
    sens = report.get("sensitivity")
    per_graph = (sens if isinstance(sens, dict) and sens and all(isinstance(v, dict) and "layers" in v
                                                                 for v in sens.values()) else {"": sens})
    spec = [("sweep", "Scheme sweep", report.get("sweep"))]
    spec += [(f"sensitivity{'_' + k if k else ''}", f"Per-layer sensitivity {k}".strip(), v) for k, v in per_graph.items()]
    out = []
    for key, title, value in spec:
        rows = rows_of(value)
        if not rows:
            continue
        png = rows_plot(rows, title)
        cols = list(dict.fromkeys(k for r in rows for k in r))
        out.append({"title": title, "plot": _plot(plots, f"{key}.png", png, title) if png else None, "columns": cols,
                    "rows": [[_num(r.get(c), 3) if isinstance(r.get(c), float) else _num(r.get(c)) for c in cols]
                             for r in rows]})
    return out


def _provenance(report: dict, manifests: dict) -> tuple[list, list]:
    model, rname = report["model"], report["recipe"]["name"]
    m0 = next((m for m in manifests.values() if m), {}) or {}
    rev = m0.get("source_revision") or {}
    prov = [["recipe", code(rname) + Markup(" hash ") + code(hash_value(report["recipe"])[:16] + "…")],
            ["model", f"{model.get('family')}: {model.get('source')}"],
            ["config sha256", code(model.get("config_hash"))], ["weights sha256", code(model.get("weights_hash"))],
            ["device", Markup("{} (").format(report["device"].get("display")) + code(report["device"].get("chipset"))
             + Markup(")")],
            ["omni-export git SHA", code(rev.get("sha")) + (" (dirty)" if rev.get("dirty") else "")]]
    for comp, cal in (report.get("calibration") or {}).items():
        prov.append([f"calibration {comp}", code(cal.get("hash")) + f", {cal.get('samples')} samples"])
    return prov, [[k, code(v)] for k, v in (m0.get("toolchain") or {}).items()]


def page_context(report: dict, manifests: dict[str, dict | None]) -> tuple[dict, dict[str, bytes]]:
    """(the template's context, {png file name: bytes}) for one run report and its artifacts' manifests."""
    arts, plots = report["artifacts"], {}
    verdicts = []
    for a in arts:
        h = headline(a)
        verdicts.append([code(a["id"]), a.get("runtime") or "-", _num(h["steps"]), _num(h["main_snr"], 1),
                         _num(h["others_min"], 1), _num(h["top1"], 3), _num(h["greedy"], 3), _verdict_cell(a)])
    by_comp: dict[str, list[dict]] = {}
    for a in arts:
        by_comp.setdefault(_component(a, manifests.get(a["id"])), []).append(a)
    snr = [_plot(plots, f"snr_{c}.png", snr_plot(c, ca), f"SNR per output of {c}") for c, ca in by_comp.items()]
    thresholds = [[code(a["id"]), t["metric"], code(t.get("outputs", "*")),
                   f">= {t['min']:g}" if t.get("min") is not None else f"<= {t['max']:g}", t.get("reason")]
                  for a in arts for t in (manifests.get(a["id"]) or {}).get("thresholds") or []]
    lm = [[code(a["id"]), _num(x.get("top1_agreement"), 3), _num(x.get("top1_positions")),
           _num(x.get("greedy_agreement"), 3), _num(x.get("greedy_positions")), _num(x.get("max_logprob_delta"), 5),
           _num(x.get("kld_mean"), 5), _num(x.get("kld_p99"), 4), _num(x.get("ppl_ratio"), 4)]
          for a in arts for x in [((a.get("parity") or {}).get("lm"))] if x]
    gt = report.get("greedy_text") or {}
    greedy_text = gt.get("note") if gt and gt.get("tokenizer") is None else texts_rows(gt)
    three_way = [[code(a["id"]), pair, ", ".join(f"{k} {v:.1f} dB" for k, v in d.items())]
                 for a in arts for pair, d in (a.get("three_way_snr_db") or {}).items()]
    files = [[code(a["id"]), code(fn), meta.get("role") or "-", f"{meta.get('bytes', 0):,}",
              code(meta.get("sha256", "")[:16] + "…")]
             for a in arts for fn, meta in ((manifests.get(a["id"]) or {}).get("artifact", {}).get("files") or {}).items()]
    prov, toolchain = _provenance(report, manifests)
    rss = report.get("peak_rss_bytes") or {}
    timings = [[k, _num(float(v), 1), _num(rss[k] / 2**30, 2) if k in rss else "-"]
               for k, v in (report.get("timings_s") or {}).items()]
    ctx = {"recipe": report["recipe"]["name"], "description": report["recipe"].get("description") or "-",
           "created": report.get("created"), "device": report["device"].get("display"),
           "family": report["model"].get("family"), "source": report["model"].get("source"),
           "exit_code": report.get("exit_code"), "verdicts": verdicts, "snr_plots": snr, "thresholds": thresholds,
           "lm": lm, "greedy_text": greedy_text, "three_way": three_way, "sections": _sections(report, plots),
           "sizes": _plot(plots, "sizes.png", size_plot(arts), "artifact sizes"), "files": files,
           "provenance": prov, "toolchain": toolchain, "timings": timings,
           "missing": [a["id"] for a in arts if manifests.get(a["id"]) is None],
           "skipped": [[code(a["id"]), _skipped_line(c)] for a in arts for c in skipped_checks(a)]}
    return ctx, plots


def build_page(report: dict, manifests: dict[str, dict | None]) -> tuple[str, dict[str, bytes]]:
    """(HTML text, {png file name: bytes}) for one run report and its artifacts' manifests (id -> manifest)."""
    ctx, plots = page_context(report, manifests)
    return _template().render(**ctx), plots


def output_dir_problem(out: Path) -> str | None:
    """Why the report may not put its directory at ``out`` (None: absent, or a real directory it replaces whole):
    a symlink, FIFO, device or regular file there is never replaced."""
    try:
        st = os.lstat(out)
    except FileNotFoundError:
        return None
    if stat.S_ISDIR(st.st_mode):
        return None
    kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "a regular file" if stat.S_ISREG(st.st_mode) else \
        "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device or socket"
    return f"is {kind}, not a directory: refused, nothing written (give a new path or a directory)"


def render_run(root: Path, run_dir: Path, report: dict, out: Path | None = None) -> Path:
    """Write report.html and its PNGs into ``out`` (default ``<run_dir>/html``) in one atomic step."""
    out = Path(out) if out else Path(run_dir) / "html"
    if why := output_dir_problem(out):
        raise BadInput(f"report output {out} {why}")
    manifests = {a["id"]: manifest_of(root, report, a) for a in report["artifacts"]}
    page, plots = build_page({**report, **extras(root, report)}, manifests)
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
