"""The model card of an export (README.md): what the model is, how to load it, the results
given with `--results` (JSON or JSONL evaluation records) and those the checkpoint recorded.
`mdlm export` (export.py) writes it."""

from __future__ import annotations

import json
import math
from pathlib import Path

from .. import __version__
from ..build import config_yaml
from ..errors import MdlmError
from ..models import DiT
from .folder import LoadedModel


def read_results(paths: list[str]) -> list[dict]:
    """Evaluation records for the model card: JSON objects, JSON lists of objects, or JSONL."""
    records: list[dict] = []
    for path in paths:
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise MdlmError(f"cannot read --results {path}: {e.strerror or e}") from None
        try:
            data = json.loads(text)
            items = data if isinstance(data, list) else [data]
        except json.JSONDecodeError:
            try:
                items = [json.loads(line) for line in text.splitlines() if line.strip()]
            except json.JSONDecodeError as e:
                raise MdlmError(
                    f"--results {path} is neither JSON nor JSONL ({e.msg}, line {e.lineno})"
                ) from None
        for item in items:
            if not isinstance(item, dict):
                raise MdlmError(f"--results {path} must hold JSON objects (one per evaluation)")
            scalar = (str, int, float, bool, type(None))
            records.append({k: v for k, v in item.items() if isinstance(v, scalar)})
    return records


CARD_HEADER = ["---", "library_name: mdlm", "tags:", "- mdlm", "- masked-diffusion",
               "- diffusion-language-model", "---", ""]
NO_CODE = ("there is no Python code in this folder, so nothing needs `trust_remote_code`. The "
           "tokenizer files sit next to them.")


def model_card(loaded: LoadedModel, config: dict, results: list[dict], where: str,
               files: str) -> str:
    """README.md of an export: what the model is (a table), how to sample from it, what the
    folder holds (`files`: its layout's sentence, export_layouts.py), its evaluation results
    and the config it was trained with."""
    intro = ("A masked diffusion language model (MDLM, Sahoo et al. 2024, arXiv:2406.07524) "
             f"exported by `mdlm` {__version__}.")
    lines = [*CARD_HEADER, f"# {loaded.config.name}", "", intro, "", "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in _card_rows(loaded, config["mdlm"]["weights"])]
    sample = f"mdlm sample --checkpoint {where} --sampler first-hitting -n 4"
    lines += ["", "## Use", "", "```bash", sample, "```", "", files + NO_CODE, ""]
    lines += ["## Evaluation results", "", *_card_results(loaded.state, results)]
    config_text = config_yaml(loaded.config).rstrip()
    lines += ["", "## Training configuration", "", "```yaml", config_text, "```", ""]
    return "\n".join(lines)


def _card_rows(loaded: LoadedModel, weights: str) -> list[tuple[str, str]]:
    """The model card's table: architecture, objective, data, schedule, training."""
    cfg, state, tok = loaded.config, loaded.state, loaded.tokenizer
    millions = loaded.model.num_parameters() / 1e6
    dataset = (cfg.data.dataset if not Path(cfg.data.dataset).suffix
               else Path(cfg.data.dataset).name)
    if isinstance(loaded.model, DiT):
        c = loaded.model.config
        backbone = (f"DiT, {c.n_blocks} blocks x {c.hidden_size}, {c.n_heads} heads, "
                    f"cond dim {c.cond_dim}, {millions:.1f}M parameters")
        if cfg.model.shift:
            backbone += ", shifted (logits at i read from i - 1)"
    else:
        backbone = f"{loaded.model.describe()}, {millions:.1f}M parameters"
    diffusion = cfg.diffusion
    schedule = f"{diffusion.schedule} (eps {diffusion.eps:g})"
    schedule += f", discrete T={diffusion.T}" if diffusion.T else ", continuous time"
    rows = [
        ("backbone", backbone),
        ("objective", f"{diffusion.objective} ({loaded.objective.description})"),
        ("vocabulary", f"{loaded.model.vocab_size} ({tok.name}, mask id {tok.mask_id})"),
        ("sequence length", f"{loaded.length} ({cfg.data.packing} packing)"),
        ("time conditioning", "on" if cfg.model.time_conditioning else "off"),
        ("schedule", schedule),
        ("weights", weights),
        ("training data", dataset),
    ]
    if isinstance(state.get("step"), int):
        steps = f"{state['step']:,}"
        if isinstance(state.get("tokens_seen"), int):
            steps += f" ({state['tokens_seen']:,} tokens)"
        rows.append(("training steps", steps))
    if state.get("source"):
        rows.append(("imported from", f"`{state['source']}` ({state.get('format', '?')})"))
    return rows


def _card_results(state: dict, results: list[dict]) -> list[str]:
    """The model card's evaluation lines: the run's validation bounds, then `--results`."""
    lines = []
    bounds = (("best_valid_nats", "best validation bound"),
              ("valid_nats", "last validation bound"))
    for key, label in bounds:
        if isinstance(state.get(key), int | float):
            perplexity = math.exp(min(state[key], 700))
            lines.append(f"- {label}: {state[key]:.4f} nats/token, "
                         f"perplexity <= {perplexity:.2f}")
    for record in results:
        lines.append("- " + ", ".join(f"{k}: {_fmt(v)}" for k, v in record.items()))
    if not lines:
        lines.append(
            "None recorded with this checkpoint (pass `mdlm export --results FILE` to add some)."
        )
    return lines


def _fmt(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
