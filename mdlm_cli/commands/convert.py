"""`mdlm convert`: a causal LM (a Hugging Face folder or cached hub id, or an mdlm AR run) as a
masked diffusion model that keeps its weights; the work is `checkpoints.convert.convert`."""

from __future__ import annotations

from typing import Annotated

import typer

from .app import app
from .console import console, user_errors

SourceArg = Annotated[str, typer.Argument(
    help="A Hugging Face causal-LM folder (config.json + safetensors: LlamaForCausalLM, "
         "Qwen2ForCausalLM, GPT2LMHeadModel), a hub id in the local Hugging Face cache, or an "
         "mdlm AR run (objective ar on the DiT).", show_default=False)]
ConvertOutOpt = Annotated[str, typer.Option(
    "--out", help="Folder to write: the target family's released layout (a Hugging Face "
                  "source) or an mdlm run folder (an AR run).", show_default=False)]
TargetOpt = Annotated[str, typer.Option(
    help="The diffusion objective the model becomes: mdlm | bd3lm (block diffusion: needs "
         "--block-size).")]
BlockSizeOpt = Annotated[int, typer.Option(
    "--block-size", help="Tokens per block of a bd3lm target (a divisor of the rows' length).",
    show_default=False)]
ShiftOpt = Annotated[bool | None, typer.Option(
    "--shift/--no-shift", show_default=False,
    help="Read a masked token's logits from the position before it, as the AR head was "
         "trained (default: on; Qwen2's Dream target always shifts).")]
AttentionOpt = Annotated[str, typer.Option(
    help="full (diffusion) | causal (the AR model's own: the equivalence check; Hugging Face "
         "sources only).")]
ReplaceOutOpt = Annotated[bool, typer.Option(help="Replace --out if it exists and is not "
                                                  "empty.")]


@app.command("convert")
def convert_cmd(
    source: SourceArg,
    out: ConvertOutOpt,
    target: TargetOpt = "mdlm",
    shift: ShiftOpt = None,
    attention: AttentionOpt = "full",
    force: ReplaceOutOpt = False,
    block_size: BlockSizeOpt = 0,
) -> None:
    """Convert a causal LM into a masked diffusion model that keeps every weight.

    LLaMA becomes the llada backbone, Qwen2 the dream backbone, GPT-2 the gpt2 backbone and an
    mdlm AR run the bidirectional DiT; a mask token is added where the vocabulary has none.
    --target bd3lm makes it a block diffusion model (BD3-LM) with --block-size tokens a block.
    The result is an ordinary --checkpoint, untrained as a diffusion model: fine-tune it with
    train.init_from (docs/conversion.md).

    [dim]Examples:[/]
      mdlm convert models/llama-tiny --out runs/llama-mdlm        # a LLaMA folder
      mdlm convert Qwen/Qwen2.5-0.5B --out runs/qwen-mdlm          # from the HF cache
      mdlm convert runs/demo-ar --out runs/demo-ar-mdlm            # an mdlm AR run
      mdlm convert models/llama-tiny --out runs/llama-bd3 --target bd3lm --block-size 32
      mdlm convert models/gpt2 --out runs/gpt2-check --attention causal --force
      mdlm sample --checkpoint runs/llama-mdlm                     # loads as any model
    """
    from pathlib import Path

    from ..checkpoints.convert import ConvertRequest, convert

    with user_errors():
        request = ConvertRequest(source, Path(out), target=target, shift=shift,
                                 attention=attention, force=force, block_size=block_size)
        console.print(convert(request).summary(), markup=False, highlight=False,
                      soft_wrap=True)
