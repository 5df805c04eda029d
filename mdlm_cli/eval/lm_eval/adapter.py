"""The lm-evaluation-harness model class `mdlm`: any mdlm checkpoint, every objective.

Importing this module needs lm-eval (`pip install "mdlm[eval]"`) and registers the class
as `mdlm` with lm-eval's `register_model`. The scoring itself is `lm_scoring.py`:

- `loglikelihood`: -log p(continuation | context): exact for AR checkpoints; for diffusion
  checkpoints the conditional NELBO (only the continuation is masked, the context is clean),
  the mean of K passes with times stratified per request, so log p >= the value returned
  in expectation. `is_greedy`: the model's argmax at every continuation position equals the
  continuation, read in one call with the whole continuation masked (diffusion) or given
  the true tokens before it (AR, greedy decoding).
- `loglikelihood_rolling`: the document's likelihood over rolling windows of the model
  length (the harness's convention); a bound for diffusion checkpoints, so word and byte
  perplexities are upper bounds.
- `generate_until`: sampled after the context with the chosen sampler, semi-autoregressively
  past the model length for diffusion models, cut at EOS and the first stop sequence.
- `apply_chat_template` (lm-eval's `apply_chat_template=True`): the harness renders each
  context with the tokeniser's chat template through it; such contexts get no row start (the
  template writes its own BOS) and a generation also ends at the template's end-of-turn
  token (LLaDA's `<|eot_id|>`, Dream's `<|im_end|>`).

Contexts longer than the model length are truncated from the left. Each request's K pass
values are kept (`scores`), so `mdlm lm-eval` reports K and the Monte-Carlo standard error.

From the shell, `python -m mdlm_cli.eval.lm_eval.adapter ...` is the harness's own command line
with `mdlm` registered (lm-eval 0.4 finds no model classes outside its package):
    python -m mdlm_cli.eval.lm_eval.adapter run --model mdlm \\
        --model_args checkpoint=runs/demo,mc_samples=4 --tasks lambada_openai --device cpu
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from ...data.chat import end_of_turn_ids, has_chat_template
from ...engine.settings import SamplingSettings
from ...errors import MdlmError
from .generation import GenerationSettings, cut_generation, generate_after
from .model_args import GREEDY_ARGS, ModelArgs, flag, task_passes
from .scoring import ConditionalScorer, Pair, Scored, encode_pair

DEFAULT_MAX_GEN_TOKS = 256  # the harness's HF models' default


@register_model("mdlm")
class MdlmLM(LM):
    """lm-eval's `LM` over an mdlm checkpoint (`--model_args checkpoint=PATH,mc_samples=K,...`:
    `ModelArgs`). `mdlm lm-eval` passes the model it loaded (`loaded`), its warnings' printer
    (`warn`) and its parsed sampling flags (`sampling`, instead of the args' text ones)."""

    def __init__(self, args: ModelArgs | None = None, *, loaded=None, warn=None,
                 sampling: SamplingSettings | None = None) -> None:
        super().__init__()
        from ...checkpoints.load import load_on_device
        from ...runtime import Runtime

        args = (args or ModelArgs()).validate()
        self.warn = warn or (lambda message: print(f"warning: {message}"))
        if loaded is None:
            loaded, rt = load_on_device(args.checkpoint, device=args.device,
                                        raw_weights=bool(args.raw_weights),
                                        adapter=args.adapter)
            for note in (
                loaded.state.get("notes") or []
            ):  # e.g. an encoder's freshly initialised MLM head
                self.warn(note)
        else:
            rt = Runtime.create(args.device or str(next(loaded.model.parameters()).device))
        self.loaded, self._device, self.dtype = loaded, rt.device, rt.dtype
        self.scorer = ConditionalScorer(
            loaded,
            mc_samples=int(args.mc_samples),
            batch_size=int(args.batch_size),
            device=rt.device,
            dtype=rt.dtype,
            seed=int(args.seed),
            estimator=args.estimator,
            cfg_scale=float(args.cfg_scale) or (sampling.cfg_scale if sampling else 0.0),
        )
        if sampling is None:  # --model_args: text values
            steps = None if args.steps is None else int(args.steps)
            sampling = SamplingSettings(args.sampler, steps, args.precision,
                                        cfg_scale=float(args.cfg_scale)).validate()
        choice = loaded.objective.choose_sampler(sampling.sampler, sampling.steps,
                                                 sampling.options)
        for name, value in choice.ignored.items():
            self.warn(f"{name}={value} does not apply to {choice.spec.name}; ignored")
        how = sampling.with_(sampler=choice.spec.name, steps=choice.steps)
        how = how.with_defaults(loaded.sampling_defaults).validate()  # e.g. LLaDA's k-schedule
        stride = None if args.stride is None else int(args.stride)
        self.generation = GenerationSettings(how, stride, int(args.seed), rt.device, rt.dtype)
        self.gen_length = None if args.gen_length is None else int(args.gen_length)
        self.greedy_check = args.greedy_check
        self.own_sampling = bool(args.own_sampling)
        self.task_k = task_passes(args.task_mc_samples)
        # task -> (request type, score)
        self.scores: dict[str, list[tuple[str, Scored]]] = defaultdict(list)
        self._generated = 0
        self._warned: set[str] = set()
        self.chat, self.stop_ids = False, None  # set by apply_chat_template (None: stop at EOS)
        self.append_eos, self.tokenizer_bos = self._conventions(args)
        if self.tokenizer_bos:
            self.scorer.start = []  # the BOS comes as text before each context

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None):
        """lm-eval's constructor from `--model_args` (`key=value,...`) and its own batch_size,
        max_batch_size and device (where given)."""
        from lm_eval.utils import simple_parse_args_string

        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None):
        """lm-eval's constructor from a dict of model args
        (`simple_evaluate(model_args={...})`)."""
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None}
        return cls(ModelArgs(**arg_dict, **extra))

    @property
    def mc_samples(self) -> int:
        return self.scorer.mc_samples

    @property
    def max_length(self) -> int:
        return self.loaded.length

    @property
    def tokenizer_name(self) -> str:
        """The harness's key for cached chat-rendered requests."""
        return self.loaded.tokenizer.name.replace("/", "__")

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        """The tokeniser's template when the harness asks for one (it has a single one)."""
        if not chat_template:
            return None
        return self._chat_tokenizer().chat_template

    def apply_chat_template(self, chat_history: list[dict[str, str]],
                            add_generation_prompt: bool = True) -> str:
        """The conversation as the template renders it (the harness calls this per context)."""
        self._chat_started()
        return self._chat_tokenizer().apply_chat_template(
            chat_history, tokenize=False, add_generation_prompt=add_generation_prompt)

    def _chat_tokenizer(self):
        hf = self.loaded.tokenizer.hf
        if not has_chat_template(self.loaded.tokenizer):
            raise MdlmError(f"--apply-chat-template needs a tokenizer with a chat template; "
                            f"{self.loaded.tokenizer.name}'s has none")
        return hf

    def _chat_started(self) -> None:
        """From the first rendered context on, no row start before a context (the template
        wrote BOS where the model expects it) and generations also stop at end of turn."""
        if not self.chat:
            self.chat = True
            self.scorer.start = []
            self.stop_ids = end_of_turn_ids(self.loaded.tokenizer)

    def _conventions(self, args: ModelArgs) -> tuple[bool, bool]:
        """(append a clean EOS, the tokeniser's BOS text first): as asked, else the family's."""
        family = self.loaded.sampling_defaults
        eos = family.get("append_eos", False) if args.append_eos is None else args.append_eos
        bos = family.get("tokenizer_bos", False) if args.tokenizer_bos is None else (
            args.tokenizer_bos)
        hf = self.loaded.tokenizer.hf
        if flag(bos) and (hf is None or hf.bos_token is None):
            raise MdlmError(f"tokenizer_bos needs a tokenizer with a bos_token; "
                            f"{self.loaded.tokenizer.name}'s has none")
        return flag(eos), flag(bos)

    def pair(self, context: str, continuation: str) -> Pair:
        """A request's (context ids, continuation ids) under the scoring conventions."""
        tok = self.loaded.tokenizer
        if self.tokenizer_bos:
            context = tok.hf.bos_token + context
        return encode_pair(tok, context, continuation)

    @property
    def start(self) -> list[int]:
        return [] if self.chat else self.loaded.row_start()

    def _record(self, requests, kind: str, scores: list[Scored]) -> None:
        for req, s in zip(requests, scores, strict=True):
            self.scores[req.task_name or "?"].append((kind, s))
        dropped = sum(s.dropped for s in scores)
        if dropped and "truncated" not in self._warned:
            self._warned.add("truncated")
            self.warn(
                f"contexts longer than the model length ({self.max_length} tokens) are "
                f"truncated from the left ({dropped} tokens dropped in this call)"
            )

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        pairs = [self.pair(*req.args) for req in requests]
        suffix = [self.loaded.tokenizer.eos_id] if self.append_eos else None
        scores: list = [None] * len(pairs)
        default = self.scorer.mc_samples
        with _progress("loglikelihood", len(pairs), disable_tqdm) as advance:
            for k, idx in self._by_passes(requests, default).items():
                self.scorer.mc_samples = k  # the task's own K, where given
                done = self.scorer.score([pairs[i] for i in idx], on_done=advance, suffix=suffix,
                                         greedy=GREEDY_ARGS[self.greedy_check])
                for i, s in zip(idx, done, strict=True):
                    scores[i] = s
        self.scorer.mc_samples = default
        self._record(requests, "loglikelihood", scores)
        return [(-s.nll, s.greedy) for s in scores]

    def _by_passes(self, requests, default: int) -> dict[int, list[int]]:
        """The requests' indices by the K their task takes (exact models: 1 for all)."""
        groups: dict[int, list[int]] = {}
        for i, req in enumerate(requests):
            k = default if self.scorer.exact else self.task_k.get(req.task_name or "", default)
            groups.setdefault(k, []).append(i)
        return groups

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        tok = self.loaded.tokenizer
        docs = [tok.encode(req.args[0]) for req in requests]
        with _progress("loglikelihood_rolling (windows)", None, disable_tqdm) as advance:
            scores = self.scorer.score_rolling(docs, on_done=advance)
        self._record(requests, "loglikelihood_rolling", scores)
        return [-s.nll for s in scores]

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        tok, out = self.loaded.tokenizer, []
        with _progress(
            f"generate_until ({self.generation.sampler})", len(requests), disable_tqdm
        ) as advance:
            for req in requests:
                context, gen_kwargs = req.args
                until, max_gen, drawing = self._generation_options(dict(gen_kwargs or {}))
                tokens = generate_after(
                    self.loaded,
                    tok.encode(context),
                    max_gen=max_gen,
                    settings=self.generation,
                    drawing=drawing,
                    index=self._generated,
                    start=self.start,
                )
                self._generated += 1
                out.append(cut_generation(tok, tokens, until, self.stop_ids))
                advance(1)
        return out

    def _generation_options(self, kwargs: dict) -> tuple[list[str], int, dict]:
        """The harness's generation kwargs: `until`, `max_gen_toks`, and `do_sample` with
        `temperature` / `top_p` / `top_k` (where the task does not set them: the settings',
        the model's top-k default among them); greedy (do_sample false or temperature 0) keeps
        only the most likely token at each draw, its confidence still over the top-k tokens
        (Dream's). Others are reported once, not used."""
        how = self.generation.how
        until = kwargs.pop("until", None) or []
        until = [until] if isinstance(until, str) else list(until)
        max_gen = int(kwargs.pop("max_gen_toks", DEFAULT_MAX_GEN_TOKS))
        max_gen = self.gen_length or max_gen  # the papers' fixed gen_length, where given
        if self.own_sampling:  # the settings' own draw, as Dream's eval.py (its top_p trims
            for key in ("do_sample", "temperature", "top_p", "top_k"):  # at temperature 0 too)
                kwargs.pop(key, None)
            self._report_unused(kwargs)
            return until, max_gen, {"temperature": how.temperature, "top_p": how.top_p,
                                    "top_k": how.top_k}
        do_sample = bool(kwargs.pop("do_sample", False))
        temperature = float(kwargs.pop("temperature", how.temperature if do_sample else 0.0))
        top_p = float(kwargs.pop("top_p", how.top_p))
        top_k = kwargs.pop("top_k", how.top_k)
        top_k = None if top_k is None else max(0, int(top_k))  # HF's top_k None or 0: off
        self._report_unused(kwargs)
        if not do_sample or temperature <= 0:  # greedy: the argmax at every draw
            return until, max_gen, {"temperature": 0.0, "top_p": 1.0, "top_k": top_k}
        return until, max_gen, {"temperature": temperature, "top_p": top_p, "top_k": top_k}

    def _report_unused(self, kwargs: dict) -> None:
        """Say once per kwarg that a task's generation kwarg is not read."""
        unused = sorted(set(kwargs) - self._warned)
        if unused:
            self._warned.update(unused)
            self.warn(
                f"generation kwargs {', '.join(unused)} do not apply to the mdlm model; ignored"
            )

    @property
    def device(self) -> torch.device:
        return self._device


@contextmanager
def _progress(label: str, total: int | None, disable: bool) -> Iterator[Callable[[int], None]]:
    """A rich progress bar on stderr, gone when done; yields `advance(n)`."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    with Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=Console(stderr=True), transient=True, disable=disable) as progress:
        task = progress.add_task(label, total=total)
        yield lambda n: progress.advance(task, n)


def main() -> None:
    """lm-eval's command line with the `mdlm` model registered."""
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()


if __name__ == "__main__":
    main()
