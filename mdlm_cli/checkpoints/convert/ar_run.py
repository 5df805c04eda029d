"""An mdlm AR run (objective `ar` on the DiT) as an MDLM run: the same DiT, key for key (what
`train.init_from` does when an MDLM run starts from it), its attention bidirectional (the
objective's) and, with the shift on, each position's logits read from the output to its left
as the AR head was trained (`model.shift`). Written as an mdlm run folder (one step folder, its
`latest` pointer and config.yaml), which every command takes as `--checkpoint` and
`train.init_from` takes as the start of a fine-tune; state.json holds the conversion record."""

from __future__ import annotations

import shutil
from pathlib import Path

from ...build import config_dict, config_from_dict, config_yaml
from ...errors import MdlmError
from ...io.files import swap_folder, temporary, write_failure
from ...models import DiT, build_model, unwrap
from ..load import load_checkpoint
from ..save import CheckpointContents, save_checkpoint

# --target names the objective the model becomes (objectives.OBJECTIVES), here and in the
# record every loader reads (models/open_weights.conversion_diffusion): one name, no mapping
TARGETS = ("mdlm", "bd3lm")


def converted_run_config(loaded, record: dict):
    """The AR run's config with the target objective (a block target's block size), and the
    shift; the rest as it trained."""
    target, shift = record["target"], record["shift"]
    data = config_dict(loaded.config)
    data["diffusion"] = {**data["diffusion"], "objective": target}
    if record.get("block_size"):
        data["diffusion"]["block_size"] = record["block_size"]
    data["model"] = {**data["model"], "shift": shift}
    data["description"] = f"converted from {loaded.path} by mdlm convert"
    return config_from_dict(data)


def convert_ar_run(path: Path, out: Path, record: dict) -> int:
    """Write the run at `path` converted (see the module) as the run folder `out`; the number
    of tensors carried over. `record`: source, target, shift, attention."""
    loaded = load_checkpoint(path)  # the EMA weights where the run kept them, as sampling
    source = unwrap(loaded.model)
    if not isinstance(source, DiT) or not loaded.objective.causal:
        raise MdlmError(f"{path} is a {loaded.config.diffusion.objective} run on "
                        f"{source.describe()}; mdlm convert takes AR runs (objective ar) on "
                        "the DiT, or a Hugging Face causal-LM folder")
    if record["attention"] != "full":
        raise MdlmError("the DiT's attention follows its objective (full for mdlm); --attention "
                        "causal applies to Hugging Face sources only")
    record["mask"] = f"the run's own (id {loaded.mask_id})"
    cfg = converted_run_config(loaded, record)
    model = build_model(cfg.model, source.vocab_size)
    model.load_state_dict(source.state_dict(), strict=True)  # the same DiT: every key fits
    state = {"step": 0, "converted_from": record,
             "notes": [f"{model.describe()}, converted from the AR run {path}; not yet "
                       "trained as a diffusion model"]}
    tmp = temporary(out)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        (tmp / "config.yaml").write_text(config_yaml(cfg))
        save_checkpoint(tmp, 0, CheckpointContents(model, cfg, state, loaded.tokenizer,
                                                   loaded.data_meta))
        swap_folder(tmp, out)
    except OSError as e:
        raise write_failure(e, out.parent, f"the converted run {out.name}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return len(model.state_dict())
