"""`mdlm convert`: a causal LM made a masked diffusion model that keeps every weight
(docs/conversion.md).

Sources: a Hugging Face causal-LM folder or a hub id in the local cache (LLaMA layout onto the
llada backbone, Qwen2 onto dream, GPT-2 onto gpt2: layouts.py), or an mdlm AR run (onto the
bidirectional DiT: ar_run.py). Refusals come first and in one line (source.py), and the output
is written into a temporary sibling renamed at the end, so a refused or failed conversion
leaves nothing behind and never half of a folder.

The output of a Hugging Face source is a folder in its target family's released layout (a
LLaDA folder, a Dream folder, or mdlm's GPT-2 layout), not an mdlm step folder: the released
layout is what the llada and dream loaders (checkpoints/formats/) already read, `train.init_from`
already adopts (build.adopt_released_folder) and every command already takes, and it keeps the
source's tensors memory-mapped in their own dtype and under names one table maps (the step
folder would add an mdlm config to keep in step with config.json). An mdlm AR run stays an
mdlm run folder, as its DiT has no released layout. Either way the conversion record (source,
target, shift, attention, how the mask was added) is written with the weights (config.json's
`mdlm_conversion`, or the step's state.json) and reported by every command that loads it.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from safetensors import SafetensorError

from ...errors import MdlmError
from ...io.files import swap_folder, temporary, write_failure
from ...models import BACKBONES
from ...models.open_weights import ATTENTIONS
from ..released import write_released
from .ar_run import TARGETS, convert_ar_run
from .hf_folder import Target, build_target
from .source import is_mdlm_run, load_source_tokenizer, local_folder, read_causal_folder

BLOCK_TARGETS = ("bd3lm",)  # the targets that take a block size


@dataclass(frozen=True)
class ConvertRequest:
    """What `mdlm convert` is asked: the source, the output folder, the target objective (and
    a block target's block size), the shift (None: on, as every supported source's head
    predicts the next token), the attention (full for diffusion, causal for the equivalence
    check) and whether `out` may be replaced."""

    source: str
    out: Path
    target: str = "mdlm"
    shift: bool | None = None
    attention: str = "full"
    force: bool = False
    block_size: int = 0

    def validate(self) -> None:
        if self.target not in TARGETS:
            raise MdlmError(f"--target {self.target!r}: one of {', '.join(TARGETS)}")
        blocks = self.target in BLOCK_TARGETS
        if blocks and self.block_size <= 0:
            raise MdlmError(f"--target {self.target} needs --block-size N, the tokens per block "
                            "(a divisor of the rows' length, e.g. 32)")
        if not blocks and self.block_size:
            raise MdlmError(f"--block-size applies to --target {', '.join(BLOCK_TARGETS)}; "
                            f"the {self.target} target has no blocks")
        if self.attention not in ATTENTIONS:
            raise MdlmError(f"--attention {self.attention!r}: one of {', '.join(ATTENTIONS)}")
        if blocks and self.attention != "full":
            raise MdlmError(f"--attention {self.attention}: a {self.target} model attends "
                            "through its block mask; convert it with full attention")
        out = Path(self.out)
        if out.exists() and not out.is_dir():
            raise MdlmError(f"--out {out} is a file; name a folder")
        if out.is_dir() and any(out.iterdir()) and not self.force:
            raise MdlmError(f"--out {out} exists and is not empty; pass --force to replace it")
        if Path(self.source).is_dir() and Path(self.source).resolve() == out.resolve():
            raise MdlmError("--out is the source folder; write the conversion elsewhere")


@dataclass(frozen=True)
class Converted:
    """What was written: the folder, the target backbone, the record and the tensor count."""

    out: Path
    backbone: str
    record: dict
    tensors: int

    def summary(self) -> str:
        r = self.record
        blocks = f", block size {r['block_size']}" if r.get("block_size") else ""
        return (f"Converted {r['source']} ({r['architecture']}) onto the {self.backbone} "
                f"backbone as {r['target']}{blocks}: {self.tensors} tensors, shift "
                f"{'on' if r['shift'] else 'off'}, "
                f"{r['attention']} attention; mask: {r['mask']}"
                f"; written to {self.out}")


def convert(request: ConvertRequest) -> Converted:
    """Convert `request.source` into `request.out` (see the module); nothing is written unless
    the whole conversion succeeds."""
    request.validate()
    out = Path(request.out)
    path = local_folder(request.source)
    record = {"source": request.source, "target": request.target,
              "shift": True if request.shift is None else request.shift,
              "attention": request.attention}
    if request.block_size:
        record["block_size"] = request.block_size
    if is_mdlm_run(path):
        record["architecture"] = "mdlm AR run (DiT)"
        return Converted(out, "dit", record, convert_ar_run(path, out, record))
    src = read_causal_folder(path, request.source)
    backbone = BACKBONES[src.layout.backbone]
    if backbone.shift_fixed and record["shift"] != backbone.default_shift:
        raise MdlmError(f"the {src.layout.backbone} backbone always reads position i from the "
                        f"output at i - 1 (Dream's shift); {src.layout.architecture} converts "
                        "with the shift on only (drop --no-shift)")
    record["architecture"] = src.layout.architecture
    target = build_target(src, load_source_tokenizer(path, request.source), record)
    positions = backbone.read_shape(target.config, request.source).max_length
    if request.block_size > positions:
        raise MdlmError(f"--block-size {request.block_size} exceeds the {positions} positions "
                        f"of {request.source}; choose a divisor of the rows' length")
    write_folder(out, target)
    return Converted(out, src.layout.backbone, target.record, len(target.weights))


def write_folder(out: Path, target: Target) -> None:
    """The weights and config.json (released.write_released, as `mdlm export` writes them) and
    the tokeniser files, into a temporary sibling of `out` that then takes its name (replacing
    what was there: --force)."""
    tmp = temporary(out)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        write_released(tmp, target.config, target.weights)  # the writer export shares
        target.tokenizer.save_pretrained(str(tmp))
        swap_folder(tmp, out)
    except (OSError, SafetensorError) as e:
        raise write_failure(e, out.parent, f"the converted folder {out.name}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
