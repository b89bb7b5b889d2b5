"""fp32's and each artifact's greedy text side by side in the run report (``parity.texts``)."""
from omni_export.parity import report as rep
from omni_export.parity.html_report import page_context
from omni_export.parity.texts import greedy_texts


class Letters:
    name, hash = "letters", "h-letters"

    def decode(self, ids):
        return "".join("abcdefghij<"[i] for i in ids)


def _report():
    lm = {"fp32_greedy_ids": [[0, 1, 2, 3], [4, 5]], "greedy_ids": [[0, 1, 10, 3], [4, 5]], "greedy_tokens": [2, 2],
          "top1_agreement": 0.9, "kld_mean": 1.5e-3}
    art = {"id": "decode_step.w8a16.qdq_onnx", "runtime": "onnxruntime-cpu", "status": "pass", "reasons": [],
           "parity": {"steps": 10, "outputs": {"logits": {"snr_db": 35.0}}, "lm": lm}, "three_way_snr_db": None}
    return {"recipe": {"name": "r"}, "model": {"family": "llama", "source": "s"}, "device": {"display": "d"},
            "artifacts": [art]}


def test_texts_mark_the_first_diverging_token_everywhere():
    r = _report()
    r["greedy_text"] = gt = greedy_texts(r, Letters())
    row = gt["components"]["decode_step"]["artifacts"]["decode_step.w8a16.qdq_onnx"][0]
    assert gt["tokenizer_hash"] == "h-letters" and gt["components"]["decode_step"]["fp32"] == ["abcd", "ef"]
    assert (row["agree"], row["same"], row["first"], row["rest"]) == (2, "ab", "<", "d")
    md = rep.markdown_summary(r)
    assert "`'ab\u27e6<\u27e7d'`" in md and "(2/4)" in md and "1.50e-03" in md
    table = rep.text_table(r)
    assert [c.header for c in table.columns][-1] == "text" and table.row_count == 4
    ctx, _ = page_context(r, {})
    cell = [x for x in ctx["greedy_text"] if x[2] != "fp32"][0][4]
    assert str(cell) == "ab<mark>&lt;</mark>d"  # the token is escaped, the mark is markup


def test_a_checkpoint_without_tokenizer_says_so():
    r = _report()
    r["greedy_text"] = greedy_texts(r, None)
    assert rep.text_table(r).startswith("the checkpoint has no tokenizer")
    assert "the checkpoint has no tokenizer" in rep.markdown_summary(r)
    r["artifacts"][0]["parity"]["lm"].pop("greedy_ids")
    assert greedy_texts(r, None) is None  # nothing generated: no section at all


def test_an_id_no_token_names_is_shown_not_a_crash():
    """A runtime whose output piece no single id names reports -1 there (``llm_runner.pieces_to_ids``); the report
    shows it as ``<id -1>`` beside fp32's text (the tokenizer's decode refuses negative ids)."""
    r = _report()
    r["artifacts"][0]["parity"]["lm"]["greedy_ids"] = [[0, 1, -1, 3], [4, 5]]
    row = greedy_texts(r, Letters())["components"]["decode_step"]["artifacts"]["decode_step.w8a16.qdq_onnx"][0]
    assert (row["agree"], row["same"], row["first"], row["rest"]) == (2, "ab", "<id -1>", "d")
