"""The cross-tokenizer example, shortened: the loss falls and agreement with the teacher rises."""


def test_example_learns_across_different_tokenizers(example, capsys):
    result = example["main"](
        ["--teacher-steps", "30", "--student-steps", "30", "--batch-size", "8", "--corpus-size", "200"]
    )
    out = capsys.readouterr().out
    assert "held-out distillation loss" in out
    assert "held-out top-1 agreement" in out
    assert "where the tokenizers split differently" in out
    assert result["loss_after"] < 0.8 * result["loss_before"]
    assert result["agreement_after"] > result["agreement_before"] + 0.2
