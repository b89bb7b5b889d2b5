"""A checkpoint whose prompts are byte-encoded (it has no tokenizer, or the family does not read the one it has)
says so in the model's provenance, which every manifest carries; a checkpoint with its own tokenizer does not."""
from ckpt_builders import VOCAB, hf_shapes, random_weights
from omni_export.commands.cli import main
from omni_export.families import build_model
from test_gguf import llama_gguf


def test_a_gguf_without_a_tokenizer_says_it_is_byte_encoded(tmp_path, trained_tokenizer):
    w = random_weights(hf_shapes(tied=False))
    bare = build_model("llama", checkpoint=llama_gguf(tmp_path / "bare.gguf", w, {}))
    assert bare.tokenizer.name == "bytes+3"
    notes = bare.provenance()["notes"]
    assert "the GGUF embeds no tokenizer" in notes
    assert f"prompts are encoded with the byte tokenizer (bytes+3, vocab {VOCAB}): the checkpoint embeds no " \
           "tokenizer" in notes
    with_tok = build_model("llama", checkpoint=llama_gguf(tmp_path / "tok.gguf", w, {}, tokenizer=trained_tokenizer))
    assert with_tok.tokenizer.name.startswith("gguf:") and not any(
        "byte tokenizer" in n for n in with_tok.provenance().get("notes", []))


def test_a_tokenizer_file_the_family_does_not_read_is_named(tmp_path, trained_tokenizer):
    ckpt = tmp_path / "c"
    assert main(["checkpoint", str(ckpt)]) == 0
    trained_tokenizer.save(str(ckpt / "tokenizer.json"))
    notes = build_model("spark", checkpoint=ckpt).provenance()["notes"]
    assert notes == ["prompts are encoded with the byte tokenizer (bytes+3, vocab 4096): the spark family does not "
                     "read its tokenizer.json"]


def test_seeded_bundles_carry_no_notes():
    assert "notes" not in build_model("spark", "tiny", seed=0).provenance()
