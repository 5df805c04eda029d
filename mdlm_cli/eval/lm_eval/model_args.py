"""The `mdlm` lm-eval model's arguments (`--model_args`, or what `mdlm lm-eval` gives) and
their checks; importing it needs no lm-eval."""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import MdlmError

GREEDY_ARGS = {"one-call": True, "by-confidence": "by-confidence"}  # ConditionalScorer.score's
GREEDY_CHECKS = tuple(GREEDY_ARGS)


@dataclass(frozen=True)
class ModelArgs:
    """The `mdlm` model's `--model_args` (lm-eval's parsed text values, or what `mdlm lm-eval`
    gives): the checkpoint (its EMA weights, or the raw ones; a LoRA adapter merged in), K
    Monte-Carlo passes of a bound, rows per batch, the device, the seed of every draw, and the
    generations' sampler, steps, semi-AR stride and draw precision. `max_batch_size` is
    lm-eval's; not used."""

    checkpoint: str = "runs/demo"
    mc_samples: int = 4
    batch_size: int | str = 16
    device: str | None = None
    seed: int = 0
    sampler: str | None = None
    steps: int | None = None
    stride: int | None = None
    precision: str = "fp64"
    raw_weights: bool = False
    adapter: str | None = None  # a LoRA adapter folder merged into the checkpoint's model
    max_batch_size: int | None = None
    # every generation's new tokens, whatever a task's max_gen_toks (LLaDA's and Dream's runs
    # fix gen_length, steps and block_length per task: eval_llada_lm_eval.sh); None: the task's
    gen_length: int | None = None
    # the bound's: t (times) or l (masked counts); None: the family's
    estimator: str | None = None
    cfg_scale: float = 0.0  # LLaDA's classifier-free guidance, in scoring and generation
    # Dream's scoring conventions (its eval.py): a clean EOS after each continuation (never
    # masked nor scored), and the tokeniser's own BOS text before each context instead of the
    # row start; None: the model family's (on for Dream, off for others)
    append_eos: bool | None = None
    tokenizer_bos: bool | None = None
    # is_greedy (LAMBADA's accuracy): "one-call" (the argmax of the whole continuation masked)
    # or "by-confidence" (LLaDA's suffix_greedy_prediction: one token a call)
    greedy_check: str = "one-call"
    # K of the tasks that take another, "task=K,task=K" (LLaDA's mc_num 1 for MMLU, CMMLU and
    # C-Eval beside 128 elsewhere); the others take mc_samples
    task_mc_samples: str = ""
    # the sampling settings for every generation, a task's do_sample, temperature, top_p and
    # top_k ignored (Dream's eval.py samples at its own temperature and top_p whatever the task)
    own_sampling: bool = False

    def validate(self) -> ModelArgs:
        if str(self.batch_size).startswith("auto"):
            raise MdlmError(
                "batch_size=auto is not supported by the mdlm model; give a number of rows"
            )
        if self.greedy_check not in GREEDY_CHECKS:
            raise MdlmError(f"greedy_check must be one of: {', '.join(GREEDY_CHECKS)} "
                            f"(got {self.greedy_check!r})")
        task_passes(self.task_mc_samples)  # a malformed list fails here, before any request
        if self.gen_length is not None and int(self.gen_length) < 1:
            raise MdlmError(f"gen_length must be at least 1 (got {self.gen_length})")
        return self


def task_passes(text: str) -> dict[str, int]:
    """"task=K,task=K" as {task: K}; one line for what does not read so."""
    out = {}
    for item in (x.strip() for x in str(text or "").split(",") if x.strip()):
        name, eq, k = item.partition("=")
        if not eq or not k.strip().isdigit() or int(k) < 1:
            raise MdlmError(f"task_mc_samples expects task=K with K >= 1, e.g. mmlu=1 "
                            f"(got {item!r})")
        out[name.strip()] = int(k)
    return out


def flag(value) -> bool:
    """A model_args flag: lm-eval hands text ("true" / "False"), mdlm lm-eval a bool."""
    return (value.strip().lower() in ("1", "true", "yes") if isinstance(value, str)
            else bool(value))
