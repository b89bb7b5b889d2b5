"""``omni-export report``: one self-contained HTML page per run, plots as PNG data URIs, no network references.

The page of a real run (spark_fp16, tiny preset) is parsed with html.parser; every image must decode to a PNG that
is also written beside the page. When Chromium is installed, a headless screenshot checks that a real browser
renders it with the network switched off."""
import base64
import json
import shutil
import subprocess
from html.parser import HTMLParser

import pytest

from omni_export.commands.cli import main
from omni_export.errors import EXIT_BAD_INPUT, EXIT_OK
from omni_export.parity.html_report import build_page, rows_of

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class _Collect(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.imgs, self.urls, self.text = [], [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        a = dict(attrs)
        if tag == "img":
            self.imgs.append(a)
        for k in ("src", "href", "srcset", "poster", "data"):
            if a.get(k) and not a[k].startswith("data:"):
                self.urls.append(a[k])

    def handle_data(self, data):
        self.text.append(data)


def _parse(page: str) -> _Collect:
    p = _Collect()
    p.feed(page)
    p.close()
    return p


@pytest.fixture(scope="module")
def rendered(fp16_store, tmp_path_factory):
    s = tmp_path_factory.mktemp("report") / "store"
    shutil.copytree(fp16_store, s, ignore=shutil.ignore_patterns("cache"))
    assert main(["report", "--store", str(s)]) == EXIT_OK
    latest = json.loads((s / "runs" / "spark_fp16" / "latest.json").read_text())
    page = s / "runs" / "spark_fp16" / latest["created"] / "html" / "report.html"
    return s, latest, page


@pytest.mark.slow
def test_the_page_is_self_contained_and_every_image_is_a_png(rendered):
    _, latest, page = rendered
    html = page.read_text()
    p = _parse(html)
    assert p.urls == [] and "script" not in p.tags and "link" not in p.tags and "@import" not in html
    assert "http://" not in html and "https://" not in html
    assert len(p.imgs) >= 2  # SNR per component + sizes
    for img in p.imgs:
        prefix = "data:image/png;base64,"
        assert img["src"].startswith(prefix)
        png = base64.b64decode(img["src"][len(prefix):], validate=True)
        assert png.startswith(PNG_MAGIC) and len(png) > 2000
        assert (page.parent / img["title"]).read_bytes() == png  # the same PNG is written beside the page
    text = " ".join(p.text)
    for heading in ("Verdicts", "SNR per output against the thresholds", "Artifact sizes", "Provenance"):
        assert heading in text
    for a in latest["artifacts"]:
        assert a["id"] in text
    assert latest["model"]["weights_hash"] in text and latest["model"]["config_hash"] in text
    assert "onnxruntime-qnn" in text  # toolchain from the manifests


@pytest.mark.slow
def test_sweep_and_sensitivity_are_rendered_when_the_report_has_them(rendered):
    s, latest, _ = rendered
    report = dict(latest)
    # the shapes `omni-export sweep` writes: sweep.json {"sweep": {"rows": [...]}}, sensitivity/<stem>.json
    report["sweep"] = {"recipe": "spark_w8a16", "rows": [
        {"scheme": "w8a16", "component": "decode_step", "logits_snr_db": 30.1, "top1_agreement": 0.97, "status": "pass"},
        {"scheme": "w8a8", "component": "decode_step", "logits_snr_db": 2.3, "top1_agreement": 0.05, "status": "blocked"},
        {"scheme": "w4a16", "component": "decode_step", "logits_snr_db": None, "status": "skipped"}]}
    report["sensitivity"] = {"decode_step.model.w8a16": {"layers": [
        {"layer": "layers.0.q_proj", "quantized": True, "weight_snr_db": 41.0, "cumulative_snr_db": 39.0},
        {"layer": "layers.1.q_proj", "quantized": True, "weight_snr_db": 35.5, "cumulative_snr_db": 33.0}]}}
    page, plots = build_page(report, {})
    assert {"sweep.png", "sensitivity_decode_step.model.w8a16.png", "sizes.png"} <= set(plots)
    assert all(png.startswith(PNG_MAGIC) for png in plots.values())
    text = " ".join(_parse(page).text)
    assert "Scheme sweep" in text and "Per-layer sensitivity decode_step.model.w8a16" in text
    assert "layers.1.q_proj" in text and "w8a8" in text and "skipped" in text
    assert "No manifest found" in text  # manifests were not given: said, not hidden


@pytest.mark.slow
def test_every_value_from_the_store_is_escaped(rendered):
    """The template autoescapes: a reason (or any value read from a report) cannot inject markup into the page."""
    _, latest, _ = rendered
    report = json.loads(json.dumps(latest))
    report["artifacts"][0].update(status="blocked", reasons=["logits <b>snr</b> & <script>x</script>"])
    page, _ = build_page(report, {})
    assert "logits &lt;b&gt;snr&lt;/b&gt; &amp; &lt;script&gt;x&lt;/script&gt;" in page
    p = _parse(page)
    assert "script" not in p.tags and "b" not in p.tags
    assert '<span class="badge blocked">BLOCKED</span>' in page  # markup the page itself writes is kept


def test_rows_of_normalises_lists_and_mappings():
    assert rows_of([{"a": 1}, "x"]) == [{"a": 1}]
    assert rows_of({"l0": 3.0, "l1": {"snr_db": 2.0}}) == [{"name": "l0", "value": 3.0}, {"name": "l1", "snr_db": 2.0}]
    assert rows_of({"recipe": "r", "rows": [{"scheme": "fp16"}]}) == [{"scheme": "fp16"}]
    assert rows_of({"layers": [{"layer": "l0"}], "outputs_snr_db": {}}) == [{"layer": "l0"}]
    assert rows_of(None) == []


def test_report_without_runs_is_bad_input(tmp_path):
    assert main(["report", "--store", str(tmp_path)]) == EXIT_BAD_INPUT


@pytest.mark.slow
def test_headless_chromium_renders_the_page_offline(rendered, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed (apt-get install chromium)")
    _, _, page = rendered
    shot = tmp_path / "report.png"
    # no network: an unreachable proxy for every request, so anything fetched remotely would be missing
    cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
           "--proxy-server=127.0.0.1:9", "--window-size=1200,2400", f"--screenshot={shot}", page.as_uri()]
    subprocess.run(cmd, capture_output=True, timeout=120, check=True)
    png = shot.read_bytes()
    assert png.startswith(PNG_MAGIC) and len(png) > 50_000  # a blank page compresses to a few kB
    import matplotlib.image

    img = matplotlib.image.imread(shot)
    assert img.shape[0] == 2400 and img.shape[1] == 1200
    assert (img[..., :3].std(axis=(0, 1)) > 0.05).any()  # not a uniform colour: the plots and tables are drawn
