"""Memory of the rollback store that ``RewardHackMitigator()`` makes for itself: the rule, and the bytes.

Usage::

    python benchmarks/rollback_store.py                   # ~20 s on 2 cores
    python benchmarks/rollback_store.py --quick --out /tmp/rollback_store   # smoke test (tiny models only)

The one-liner keeps ``KEEP_LAST`` (3) rollback checkpoints. It keeps them in memory when one process trains
and ``3 x checkpoint_bytes(model)`` fits ``IN_MEMORY_LIMIT`` (2 GiB), else on disk in ``output_dir``
(``loopguard/adapters/_respond.py``: ``default_manager``). ``checkpoint_bytes`` is the rule's estimate of one
checkpoint: the saved weights' bytes (every parameter; a PEFT model's adapters only), plus two Adam moments
per trainable parameter in its dtype.

For each policy shape (built from a config on the ``meta`` device: no memory, no download) and each set-up
(full fine-tuning in float32 or bfloat16; LoRA r=16 on a bfloat16 base), the script reports:

* the rule's estimate per checkpoint and for the 3 the store keeps, and where the store goes;
* what one checkpoint actually holds: the weights ``CheckpointManager`` saves (the full ``state_dict`` with
  tied weights once, or only the adapter of a PEFT model) plus the optimizer's two moments per trainable
  parameter, in the parameter's dtype (``torch.optim.AdamW`` creates them with ``zeros_like``).

``--validate`` (on by default) checks that last formula against real files: a small real GPT-2, full and
LoRA, after one AdamW step, saved by ``CheckpointManager`` to disk; it reports the bytes of
``model.safetensors`` + ``optimizer.pt`` next to the formula.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings
from typing import Any

import torch

from loopguard.adapters._respond import IN_MEMORY_LIMIT, KEEP_LAST, checkpoint_bytes

GIB = 2**30
MIB = 2**20


def shapes(quick: bool) -> dict[str, Any]:
    from transformers import GPT2Config, Qwen2Config

    found = {
        "tiny GPT-2 (examples/recipes)": GPT2Config(
            vocab_size=28, n_positions=64, n_embd=32, n_layer=2, n_head=2, bos_token_id=2, eos_token_id=1
        ),
    }
    if not quick:
        found["Qwen2.5-0.5B shape"] = Qwen2Config(
            hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
            num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
        )  # fmt: skip
        found["Qwen2.5-7B shape"] = Qwen2Config(
            hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
            num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False,
        )  # fmt: skip
    return found


def lora_targets(config: Any) -> list[str]:
    return ["c_attn"] if config.model_type == "gpt2" else ["q_proj", "k_proj", "v_proj", "o_proj"]


def build(config: Any, setup: str, device: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    dtype = torch.float32 if setup == "full, float32" else torch.bfloat16
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    if setup.startswith("LoRA"):
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(r=16, lora_alpha=32, target_modules=lora_targets(config), task_type="CAUSAL_LM")
        model = get_peft_model(model, lora)
    return model


def holds_bytes(model: torch.nn.Module) -> int:
    """Bytes one checkpoint holds: the saved weights, plus two optimizer moments per trainable parameter."""
    from loopguard.checkpoint._state import peft_module

    peft = peft_module(model)
    if peft is not None:
        saved = peft.get_peft_model_state_dict(model).values()
    else:  # named_parameters drops tied duplicates (stored once); non-persistent buffers are not saved
        persistent = set(model.state_dict())
        saved = [p for _, p in model.named_parameters()]
        saved += [b for name, b in model.named_buffers() if name in persistent]
    weights = sum(t.numel() * t.element_size() for t in saved)
    moments = sum(2 * p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return int(weights + moments)


def rows(quick: bool) -> list[dict[str, Any]]:
    found = []
    for name, config in shapes(quick).items():
        for setup in ("full, float32", "full, bfloat16", "LoRA r=16, bfloat16 base"):
            model = build(config, setup, "meta")
            estimate = checkpoint_bytes(model)
            found.append(
                {
                    "model": name,
                    "setup": setup,
                    "parameters": sum(p.numel() for p in model.parameters()),
                    "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
                    "estimate_bytes": estimate,
                    "store_estimate_bytes": KEEP_LAST * estimate,
                    "one_process": "memory" if KEEP_LAST * estimate <= IN_MEMORY_LIMIT else "disk",
                    "holds_bytes": holds_bytes(model),
                }
            )
    return found


def validate(quick: bool) -> list[dict[str, Any]]:
    """Formula vs files: a real GPT-2 after one AdamW step, saved by CheckpointManager."""
    from transformers import GPT2Config

    from loopguard.checkpoint import CheckpointManager

    width, layers = (64, 2) if quick else (256, 4)
    config = GPT2Config(
        vocab_size=8192,
        n_positions=128,
        n_embd=width,
        n_layer=layers,
        n_head=4,
        bos_token_id=0,
        eos_token_id=0,
    )
    found = []
    for setup in ("full, float32", "LoRA r=16, bfloat16 base"):
        torch.manual_seed(0)
        model = build(config, setup, "cpu")
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
        ids = torch.randint(0, 8192, (2, 16))
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        with tempfile.TemporaryDirectory() as folder:
            CheckpointManager(folder, keep_last=1).save(1, model, optimizer)
            step = os.path.join(folder, "step-00000001")
            files = {
                name: os.path.getsize(os.path.join(step, name))
                for name in ("model.safetensors", "optimizer.pt")
            }
        found.append(
            {
                "model": f"GPT-2 {layers} layers x {width}",
                "setup": setup,
                "parameters": sum(p.numel() for p in model.parameters()),
                "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
                "holds_bytes": holds_bytes(model),
                "files_bytes": sum(files.values()),
                "files": files,
                "estimate_bytes": checkpoint_bytes(model),
            }
        )
    return found


def _count(count: float) -> str:
    return f"{count / 1e6:,.1f} M" if count >= 1e5 else f"{count / 1e3:,.1f} K"


def _size(count: float) -> str:
    if count >= GIB:
        return f"{count / GIB:.2f} GiB"
    return f"{count / MIB:.1f} MiB" if count >= MIB / 10 else f"{count / 1024:.0f} KiB"


def markdown(table: list[dict[str, Any]], checked: list[dict[str, Any]]) -> str:
    lines = [
        "| model | set-up | parameters | trainable | rule's estimate, 1 checkpoint | x 3 | one process | "
        "one checkpoint holds |",
        "|---|---|---:|---:|---:|---:|---|---:|",
    ]
    for row in table:
        lines.append(
            f"| {row['model']} | {row['setup']} | {_count(row['parameters'])} | "
            f"{_count(row['trainable'])} | {_size(row['estimate_bytes'])} | "
            f"{_size(row['store_estimate_bytes'])} | {row['one_process']} | {_size(row['holds_bytes'])} |"
        )
    if checked:
        lines += [
            "",
            "| check | set-up | formula (holds) | model.safetensors + optimizer.pt | ratio |",
            "|---|---|---:|---:|---:|",
        ]
        for row in checked:
            lines.append(
                f"| {row['model']} | {row['setup']} | {_size(row['holds_bytes'])} | "
                f"{_size(row['files_bytes'])} | {row['files_bytes'] / row['holds_bytes']:.3f} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.join("benchmarks", "results"), help="output folder")
    parser.add_argument("--quick", action="store_true", help="tiny models only (a smoke test)")
    parser.add_argument("--no-validate", dest="validate", action="store_false", help="skip the file check")
    options = parser.parse_args(argv)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)  # peft: fan_in_fan_out on GPT-2's Conv1D
    import transformers

    transformers.logging.set_verbosity_error()
    started = time.perf_counter()
    table = rows(options.quick)
    checked = validate(options.quick) if options.validate else []
    text = markdown(table, checked)
    os.makedirs(options.out, exist_ok=True)
    report = {
        "keep_last": KEEP_LAST,
        "in_memory_limit_bytes": IN_MEMORY_LIMIT,
        "rows": table,
        "validation": checked,
        "seconds": time.perf_counter() - started,
    }
    with open(os.path.join(options.out, "rollback_store.json"), "w", encoding="utf-8") as handle:
        json.dump(report, handle, indent=1)
    with open(os.path.join(options.out, "rollback_store.md"), "w", encoding="utf-8") as handle:
        handle.write(text)
    print(text)
    elapsed = time.perf_counter() - started
    print(f"wrote {options.out}/rollback_store.json and rollback_store.md ({elapsed:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
