"""Distil a tiny teacher into a tiny student that uses a *different* tokenizer, on CPU, in under a minute.

The teacher (GPT-2 architecture) reads text with a byte-level BPE tokenizer ("Ġ" space markers); the student
(Llama architecture) reads the same text with a SentencePiece-style Unigram tokenizer ("▁" markers). Both
tokenizers are trained here on a small generated corpus, so nothing is downloaded. The teacher is first
trained on the corpus; the student then learns from the teacher alone (no labels):

1. each model tokenizes the text itself -- the teacher never sees the student's token ids;
2. :func:`loopguard.distill.align_offsets` groups the two tokenizations at shared character boundaries;
3. :func:`loopguard.distill.merge_aligned_probs` gives one probability row per group and model;
4. :func:`loopguard.distill.topk_align` compares the rows: the teacher's top-k tokens that exist in the
   student's vocabulary (:class:`loopguard.distill.TokenMapping`) token by token, the rest by sorted ULD.

It prints the distillation loss and the student's top-1 agreement with the teacher on held-out text, before
and after. Run: ``python examples/distill_cross_tokenizer.py`` (``--help`` for the knobs).
"""

from __future__ import annotations

import argparse
import os
import random
from dataclasses import dataclass

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from loopguard.distill import OffsetAlignment, TokenMapping, align_offsets, merge_aligned_probs, topk_align

SUBJECTS = ["the cat", "the dog", "a bird", "my friend", "the teacher", "our neighbour", "the children"]
VERBS = ["sat on", "looked at", "walked to", "jumped over", "talked about", "painted", "remembered"]
OBJECTS = ["the mat", "the garden", "a small house", "the river", "the old tree", "the yellow bicycle"]
ENDINGS = ["today", "again", "quietly", "in the morning", "before dinner", "with great enthusiasm"]


def make_corpus(count: int, seed: int) -> list[str]:
    """Sentences from a small grammar: predictable enough for a tiny model to learn in seconds."""
    rng = random.Random(seed)
    return [
        f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(ENDINGS)}"
        for _ in range(count)
    ]


def teacher_tokenizer(corpus: list[str], vocab_size: int = 360) -> PreTrainedTokenizerFast:
    """Byte-level BPE (GPT-2 style: a leading space is part of the token, written "Ġ")."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )


def student_tokenizer(corpus: list[str], vocab_size: int = 90) -> PreTrainedTokenizerFast:
    """Unigram with SentencePiece's "▁" space marker, and a smaller vocabulary: words split differently."""
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.UnigramTrainer(
        vocab_size=vocab_size, special_tokens=["<unk>", "</s>"], unk_token="<unk>", show_progress=False
    )
    tokenizer.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", eos_token="</s>", pad_token="</s>"
    )


@dataclass
class Example:
    """One text as each model sees it, the alignment of the two tokenizations, and the teacher's logits."""

    student_ids: torch.Tensor
    teacher_ids: torch.Tensor
    alignment: OffsetAlignment
    teacher_logits: torch.Tensor | None = None


def encode(
    texts: list[str], student_tok: PreTrainedTokenizerFast, teacher_tok: PreTrainedTokenizerFast
) -> list[Example]:
    """Each model's own token ids of every text (the teacher never sees the student's) and their alignment."""
    examples = []
    for text in texts:
        s = student_tok(text, return_offsets_mapping=True)
        t = teacher_tok(text, return_offsets_mapping=True)
        alignment = align_offsets(s["offset_mapping"], t["offset_mapping"])
        examples.append(Example(torch.tensor(s["input_ids"]), torch.tensor(t["input_ids"]), alignment))
    return examples


def pad(sequences: list[torch.Tensor], value: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.nn.utils.rnn.pad_sequence(sequences, batch_first=True, padding_value=value)
    mask = torch.nn.utils.rnn.pad_sequence([torch.ones_like(s) for s in sequences], batch_first=True)
    return ids, mask


def attach_teacher_logits(examples: list[Example], teacher: torch.nn.Module, pad_t: int) -> None:
    """The teacher is frozen: run it once over every text and keep its logits."""
    with torch.no_grad():
        for start in range(0, len(examples), 64):
            chunk = examples[start : start + 64]
            ids, mask = pad([e.teacher_ids for e in chunk], pad_t)
            logits = teacher(input_ids=ids, attention_mask=mask).logits
            for index, example in enumerate(chunk):
                example.teacher_logits = logits[index, : len(example.teacher_ids)].clone()


def aligned_rows(
    batch: list[Example], student: torch.nn.Module, pad_s: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merged probability rows of every aligned group in the batch, each model on its own token ids."""
    s_ids, s_mask = pad([e.student_ids for e in batch], pad_s)
    student_logits = student(input_ids=s_ids, attention_mask=s_mask).logits
    rows_s, rows_t = [], []
    for index, example in enumerate(batch):
        assert example.teacher_logits is not None
        s_rows, t_rows = merge_aligned_probs(
            student_logits[index, : len(example.student_ids)],
            example.teacher_logits,
            example.student_ids,
            example.teacher_ids,
            example.alignment,
        )
        rows_s.append(s_rows)
        rows_t.append(t_rows)
    return torch.cat(rows_s), torch.cat(rows_t)


def evaluate(
    examples: list[Example], student: torch.nn.Module, mapping: TokenMapping, pad_s: int, k: int
) -> tuple[float, float]:
    """Held-out distillation loss, and how often the student's top token is the teacher's (where mapped)."""
    student.eval()
    with torch.no_grad():
        rows_s, rows_t = aligned_rows(examples, student, pad_s)
        loss = float(topk_align(rows_s, rows_t, mapping, k=k).mean())
        table = torch.as_tensor(mapping.teacher_to_student)
        teacher_top = table[rows_t.argmax(-1)]
        mapped = teacher_top >= 0
        agreement = float((rows_s.argmax(-1)[mapped] == teacher_top[mapped]).float().mean())
    student.train()
    return loss, agreement


def train_teacher(
    teacher: torch.nn.Module, examples: list[Example], steps: int, batch_size: int, pad_t: int, seed: int
) -> None:
    optimizer = torch.optim.AdamW(teacher.parameters(), lr=1e-2)
    rng = random.Random(seed)
    for _ in range(steps):
        batch = rng.sample(examples, batch_size)
        ids, mask = pad([e.teacher_ids for e in batch], pad_t)
        labels = ids.masked_fill(mask == 0, -100)
        loss = teacher(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    teacher.eval()


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teacher-steps", type=int, default=150)
    parser.add_argument("--student-steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--corpus-size", type=int, default=600)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(min(2, torch.get_num_threads()))

    corpus = make_corpus(args.corpus_size, args.seed)
    held_out = make_corpus(64, args.seed + 1)
    teacher_tok, student_tok = teacher_tokenizer(corpus), student_tokenizer(corpus)
    mapping = TokenMapping.from_tokenizers(student_tok, teacher_tok)
    train, test = encode(corpus, student_tok, teacher_tok), encode(held_out, student_tok, teacher_tok)
    pads = (student_tok.pad_token_id, teacher_tok.pad_token_id)
    same = sum(e.alignment.one_to_one for e in test)
    groups = sum(len(e.alignment.student_groups) for e in test)
    print(f"vocabularies: teacher {len(teacher_tok)} (byte-level BPE), student {len(student_tok)} (Unigram)")
    print(
        f"token mapping: {mapping.matched} shared pieces, teacher coverage {mapping.teacher_coverage:.1%}, "
        f"student coverage {mapping.student_coverage:.1%}"
    )
    print(f"held-out alignment: {groups} groups, {groups - same} where the tokenizers split differently")

    teacher = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=len(teacher_tok),
            n_positions=64,
            n_embd=64,
            n_layer=2,
            n_head=2,
            bos_token_id=teacher_tok.eos_token_id,
            eos_token_id=teacher_tok.eos_token_id,
        )
    )
    train_teacher(teacher, train, args.teacher_steps, args.batch_size, pads[1], args.seed)
    attach_teacher_logits(train + test, teacher, pads[1])
    student = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(student_tok),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=64,
        )
    )
    before = evaluate(test, student, mapping, pads[0], args.top_k)
    optimizer = torch.optim.AdamW(student.parameters(), lr=3e-3)
    rng = random.Random(args.seed + 2)
    for _ in range(args.student_steps):
        rows_s, rows_t = aligned_rows(rng.sample(train, args.batch_size), student, pads[0])
        loss = topk_align(rows_s, rows_t, mapping, k=args.top_k).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after = evaluate(test, student, mapping, pads[0], args.top_k)
    print(f"held-out distillation loss:      before {before[0]:.4f} -> after {after[0]:.4f}")
    print(f"held-out top-1 agreement:        before {before[1]:.1%} -> after {after[1]:.1%}")
    return {
        "loss_before": before[0],
        "loss_after": after[0],
        "agreement_before": before[1],
        "agreement_after": after[1],
    }


if __name__ == "__main__":
    main()
