"""The plots of the HTML report: PNG bytes from matplotlib (Agg, no display), and the row normalisation the
sweep and sensitivity sections share."""
from __future__ import annotations

import io

from matplotlib.figure import Figure

COLOURS = {"pass": "#2e7d32", "fail": "#c62828", "none": "#90a4ae", "threshold": "#212121"}


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
