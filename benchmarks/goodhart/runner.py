"""One benchmark run: a scenario, an arm and a seed -> a GRPO run on the CPU and its per-step record.

The arms (:data:`ARMS`):

* ``fixed-<beta>`` -- plain GRPO at a fixed beta; ``fixed-0.001`` is the *unguarded* run;
* ``adaptive_kl`` -- the Ziegler et al. (2019) adaptive KL controller (loopguard's ``AdaptiveKL`` in
  ``mode="adaptive_kl"``: no hack signals, beta steered toward a KL target), from beta 0.001;
* ``lg_no_reference`` -- the ``lg_log_only`` Guard with the reference sample off (``reference_steps=0``,
  so without ``takeover``): what a user loses by turning it off;
* ``lg_no_reanchor`` -- ``lg_kl_control`` with re-anchoring off (``EscalationLadder(reanchor=False)``): a
  rollback restores the policy and leaves the KL reference at the initial model (the ablation of the
  ladder's ``reanchor`` default);
* ``lg_no_collapse`` -- ``lg_kl_control`` without the ``collapse`` signal (the ablation of that default
  signal, which corroborates a primary one at WARN: see ``docs/benchmarks.md``);
* ``lg_log_only`` / ``lg_kl_control`` / ``lg_pid_rollback`` -- ``RewardHackMitigator`` in ``log_only``,
  ``kl_control`` and ``pid_lagrangian`` mode (the last two with the rollback ladder), from beta 0.001, with
  the *same* signals and settings in every scenario (:func:`loopguard_mitigator`).

Each step records the mean proxy and gold reward of the step's generation batch, the beta the step was
trained with, the step's wall time and the time spent inside loopguard's callbacks. A run that loopguard
stops keeps its final (restored) policy for the rest of the step budget: the remaining steps' gold and proxy
are measured by sampling that policy with the training generation settings (``held`` in the record), so
every arm is scored over the same steps.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import functools
import importlib
import logging
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

import datasets
import torch
import transformers
from datasets import Dataset
from transformers import AutoModelForCausalLM, PrinterCallback, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from benchmarks.goodhart.policy import build_tokenizer, prompts, save_initial_policy
from benchmarks.goodhart.scenarios import MAX_TOKENS, SCENARIOS, Reward, Scenario, noisy
from loopguard import EscalationLadder, Guard, RewardHackMitigator, read_mitigation_log
from loopguard.control import AdaptiveKL
from loopguard.detectors import RMEnsemble

# Imported before any run: the mitigator imports it at train start, and where Python may not cache bytecode
# (PYTHONDONTWRITEBYTECODE, as on the machine these results come from) that import compiles the package
# every run, about 60-100 ms that a normal install pays once; it is not loopguard's time per step.
importlib.import_module("loopguard.checkpoint")

START_BETA = 0.001
ENSEMBLE = ("rm_a", "rm_b", "rm_c", "rm_d")  # the watched reward models (rm_a is the flawed proxy)
FIXED_BETAS = (0.001, 0.01, 0.03, 0.1, 0.3)
ARMS: tuple[str, ...] = (
    *(f"fixed-{beta:g}" for beta in FIXED_BETAS),
    "adaptive_kl",
    "lg_log_only",
    "lg_kl_control",
    "lg_pid_rollback",
    "lg_no_reference",
    "lg_no_reanchor",
    "lg_no_collapse",
    "lg_default",
)
UNGUARDED = "fixed-0.001"
LOOPGUARD_ARMS = ("lg_log_only", "lg_kl_control", "lg_pid_rollback", "lg_default")
ONE_LINER = "lg_default"  # the bare RewardHackMitigator(): nothing configured
# the log-only Guard with the reference sample off: what turning it off loses
NO_REFERENCE = "lg_no_reference"
NO_REANCHOR = "lg_no_reanchor"  # lg_kl_control with re-anchoring off: the ablation of that ladder default
NO_COLLAPSE = "lg_no_collapse"  # lg_kl_control without the collapse signal: that default's ablation
ABLATION_ARMS = (NO_REFERENCE, NO_REANCHOR, NO_COLLAPSE)  # loopguard arms with one part turned off
_LOOPGUARD_MODES = {
    "lg_log_only": "log_only",
    "lg_kl_control": "kl_control",
    "lg_pid_rollback": "pid_lagrangian",
}
ADAPTIVE_TARGET = 0.05  # per-token KL (TRL's logged "kl"), see docs/benchmarks.md
ADAPTIVE_HORIZON = 320  # in completions (n_steps = 16 per update): at most 1 % change per step, as in Ziegler
# et al. (2019), whose batches of 512 with a horizon of 10,000 allow 0.2 * 512 / 10,000 = 1 % per update

GENERATIONS = 8
BATCH = 16  # completions per step: 2 prompts x 8 generations
LEARNING_RATE = 3e-3


def loopguard_mitigator(
    mode: str, *, reference: bool = True, reanchor: bool = True, collapse: bool = True
) -> RewardHackMitigator:
    """The one loopguard configuration used in every scenario (only the mode differs between arms).

    ``reference=False`` (log-only) turns the reference sample off, and with it ``takeover``, which needs it.
    The arms that act use the default escalation ladder and the mitigator's own rollback store (in memory
    for these tiny policies); ``reanchor=False`` turns the ladder's re-anchoring off; ``collapse=False``
    leaves the ``collapse`` signal out.
    """
    signals: list[Any] = ["repetition", "diversity", "length", *(["collapse"] if collapse else []), "drift"]
    signals += [RMEnsemble(members=ENSEMBLE), "takeover"] if reference else [RMEnsemble(members=ENSEMBLE)]
    if mode == "log_only":
        return RewardHackMitigator(
            guard=Guard(signals, mode="log_only", reference_steps=3 if reference else 0)
        )
    return RewardHackMitigator(guard=Guard(signals, mode=mode, ladder=EscalationLadder(reanchor=reanchor)))


class _Recorder(TrainerCallback):
    """Per-step beta and wall time; the reward functions record proxy and gold."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.beta: list[float] = []
        self.step_seconds: list[float] = []
        self._started = 0.0

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.beta.append(float(self.trainer.beta))
        self._started = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.step_seconds.append(time.perf_counter() - self._started)


def _timed(method: Callable[..., Any], sink: list[float]) -> Callable[..., Any]:
    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            sink.append(time.perf_counter() - started)

    return wrapper


def _reward_functions(
    scenario: Scenario, steps: int, series: dict[str, list[float]]
) -> list[Callable[..., list[float]]]:
    """The trained reward (weight 1; records proxy, gold and length) then the watched ensemble (weight 0)."""

    def trained(completions: list[str], trainer_state: Any = None, **kwargs: Any) -> list[float]:
        texts = list(completions)
        step = trainer_state.global_step if trainer_state is not None else steps
        values = scenario.trained(step, steps)(texts)
        proxy, gold = scenario.proxy(texts), scenario.gold(texts)  # never trained on, only recorded
        series["proxy"].append(sum(proxy) / len(proxy))
        series["gold"].append(sum(gold) / len(gold))
        series["length"].append(sum(len(c.split()) for c in texts) / len(texts))
        return values

    functions: list[Callable[..., list[float]]] = [trained]
    for name, variant in scenario.ensemble:
        member = noisy(name, variant)

        def watched(completions: list[str], _member: Reward = member, **kwargs: Any) -> list[float]:
            return _member(list(completions))

        watched.__name__ = name
        functions.append(watched)
    return functions


@torch.no_grad()
def _sample(model: Any, tokenizer: Any, texts: list[str], seed: int) -> list[str]:
    torch.manual_seed(seed)
    batch = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    model.eval()
    output = model.generate(
        **batch, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=MAX_TOKENS,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    return tokenizer.batch_decode(output[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)


def _quiet() -> None:
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    logging.getLogger("loopguard").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)


def run_one(
    scenario_name: str, arm: str, seed: int, steps: int, work_dir: str | None = None
) -> dict[str, Any]:
    """Train one arm of one scenario for ``steps`` GRPO steps and return its per-step record (JSON-ready)."""
    if arm not in ARMS:
        msg = f"`arm` must be one of {', '.join(ARMS)}, got {arm!r}."
        raise ValueError(msg)
    scenario = SCENARIOS[scenario_name]
    torch.set_num_threads(1)
    _quiet()
    owned = work_dir is None
    folder = tempfile.mkdtemp(prefix="goodhart_") if work_dir is None else work_dir
    try:
        tokenizer = build_tokenizer()
        model_dir = save_initial_policy(os.path.join(folder, "initial"), tokenizer, seed, scenario.warm_start)
        beta = float(arm.split("-", 1)[1]) if arm.startswith("fixed-") else START_BETA
        args = GRPOConfig(
            output_dir=os.path.join(folder, "run"), use_cpu=True, bf16=False, report_to=[], logging_steps=1,
            save_strategy="no", num_generations=GENERATIONS, per_device_train_batch_size=BATCH,
            max_completion_length=MAX_TOKENS, learning_rate=LEARNING_RATE, lr_scheduler_type="constant",
            beta=beta, max_steps=steps, reward_weights=[1.0] + [0.0] * len(scenario.ensemble), seed=seed,
            disable_tqdm=True, temperature=1.0,
        )  # fmt: skip
        series: dict[str, list[float]] = {"proxy": [], "gold": [], "length": []}
        trainer = GRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(model_dir),
            reward_funcs=_reward_functions(scenario, steps, series),
            args=args,
            train_dataset=Dataset.from_dict({"prompt": prompts(seed, steps * BATCH // GENERATIONS + 16)}),
            processing_class=tokenizer,
        )
        trainer.remove_callback(PrinterCallback)
        recorder = _Recorder(trainer)
        trainer.add_callback(recorder)
        loopguard_seconds: list[float] = []
        mitigator = None
        log_path = os.path.join(folder, "run", "mitigation_log.jsonl")
        if arm == "adaptive_kl":
            mitigator = RewardHackMitigator(
                guard=Guard(
                    mode="adaptive_kl",
                    controller=AdaptiveKL(target=ADAPTIVE_TARGET, horizon=ADAPTIVE_HORIZON),
                )
            )
        elif arm == ONE_LINER:
            mitigator = RewardHackMitigator()
        elif arm in LOOPGUARD_ARMS:
            mitigator = loopguard_mitigator(_LOOPGUARD_MODES[arm])
        elif arm == NO_REANCHOR:
            mitigator = loopguard_mitigator("kl_control", reanchor=False)
        elif arm == NO_COLLAPSE:
            mitigator = loopguard_mitigator("kl_control", collapse=False)
        elif arm == NO_REFERENCE:
            mitigator = loopguard_mitigator("log_only", reference=False)
        if mitigator is not None:
            for event in ("on_train_begin", "on_step_end", "on_log", "on_save"):
                setattr(mitigator, event, _timed(getattr(mitigator, event), loopguard_seconds))
            trainer.add_callback(mitigator)
        started = time.perf_counter()
        trainer.train()
        train_seconds = time.perf_counter() - started
        capture = getattr(trainer, "_loopguard_id_capture", None)  # reads the ids inside generation steps
        if capture is not None:
            loopguard_seconds.append(capture.seconds)
        # the targeted penalty, inside the trainer's reward step (counted since 2026-12-05; kept apart too)
        penalty_seconds = sum(float(getattr(fn, "loopguard_seconds", 0.0)) for fn in trainer.reward_funcs)
        loopguard_seconds.append(penalty_seconds)
        trained = len(series["gold"])
        held = 0
        if trained < steps:  # stopped by loopguard: the final (restored) policy holds for the rest
            eval_prompts = prompts(seed + 777, 16)
            while len(series["gold"]) < steps:
                texts = _sample(trainer.model, tokenizer, eval_prompts[:2] * GENERATIONS, seed * 1000 + held)
                proxy, gold = scenario.proxy(texts), scenario.gold(texts)
                series["proxy"].append(sum(proxy) / len(proxy))
                series["gold"].append(sum(gold) / len(gold))
                series["length"].append(sum(len(t.split()) for t in texts) / len(texts))
                recorder.beta.append(recorder.beta[-1] if recorder.beta else beta)
                held += 1
        records = read_mitigation_log(log_path) if os.path.exists(log_path) else []
        return {
            "scenario": scenario_name,
            "arm": arm,
            "seed": seed,
            "steps": steps,
            "trained_steps": trained,
            "held_steps": held,
            "proxy": series["proxy"][:steps],
            "gold": series["gold"][:steps],
            "length": series["length"][:steps],
            "beta": recorder.beta[:steps],
            "kl": [float(e["kl"]) for e in trainer.state.log_history if "kl" in e],
            "step_seconds": recorder.step_seconds,
            "loopguard_seconds": sum(loopguard_seconds),
            "penalty_seconds": penalty_seconds,
            "train_seconds": train_seconds,
            "log": [
                {
                    key: r[key]
                    for key in ("step", "verdict", "vote", "action", "beta_before", "beta_after", "signals")
                }
                for r in records
                if r["event"] == "decision"
            ],
            "rollbacks": getattr(mitigator, "rollbacks", []) if mitigator is not None else [],
        }
    finally:
        if owned:
            shutil.rmtree(folder, ignore_errors=True)
