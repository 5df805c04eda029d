"""Published MDLM weights: the reference implementation's formats, mapped onto mdlm's DiT.

`checkpoint.load_checkpoint` hands every `--checkpoint` that is not an mdlm run or step
folder to `load_pretrained`, so all commands accept:

- a Hugging Face hub id such as `kuleshov-group/mdlm-owt`: huggingface_hub downloads
  config.json, the safetensors weights and any tokeniser files, never Python files (no
  remote code runs);
- a local Hugging Face-style folder (what `mdlm export` writes, or a download of a hub
  repo): config.json with the reference `MDLMConfig` fields (`vocab_size`, `model_length`,
  `hidden_dim`, `cond_dim`, `n_blocks`, `n_heads`, `dropout`, `time_conditioning`) and
  `model.safetensors` (or a sharded index, or `pytorch_model.bin` read with
  weights_only=True) holding the reference's `backbone.*` keys;
- a reference Lightning checkpoint (`.ckpt`): `state_dict` with `backbone.*` keys, the EMA
  in `ema.shadow_params` (a list in parameter order, as the reference's models/ema.py
  stores it) and the hyper-parameters of the pickled Hydra config, read as inert data
  (safe_load.py).

The reference DiT and mdlm's share their module tree (models/dit.py), so the mapping is a
prefix strip. The reference also stores its rotary table `rotary_emb.inv_freq`, which mdlm
recomputes: it is checked against the head size, then dropped. Hyper-parameters come from
the checkpoint (its config first, the weight shapes otherwise), never from flags.
"""

from __future__ import annotations

import json
import logging
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .checkpoint import LoadedModel, _load_weights, load_state_into
from .config import Config, TrainConfig, config_from_dict
from .data.tokenizers import Tokenizer, load_tokenizer
from .errors import MdlmError
from .models import DiT, DiTConfig
from .safe_load import plain, read_torch_file

# What a hub download fetches: configuration, weights and tokeniser files; never code.
HUB_FILES = ["config.json", "*.safetensors", "*.safetensors.index.json", "tokenizer.json", "tokenizer_config.json",
             "special_tokens_map.json", "added_tokens.json", "vocab.json", "vocab.txt", "merges.txt",
             "mdlm_tokenizer.json"]
TOKENIZER_FILES = ("mdlm_tokenizer.json", "tokenizer.json", "tokenizer_config.json", "vocab.json", "vocab.txt")
INV_FREQ = "rotary_emb.inv_freq"
# Key prefixes, tried in order: a Lightning module around the HF model, the Lightning
# module or the HF `MDLM` (`backbone.`), a bare DiT state dict.
PREFIXES = ("backbone.backbone.", "backbone.", "")
# The reference tokenisers by model vocabulary (mask included), with the data they imply.
KNOWN_VOCABS = {50258: "gpt2", 30522: "bert-base-uncased", 35: "char"}
TOKENIZER_DEFAULTS = {  # name -> (dataset, packing, length) of the reference's runs
    "gpt2": ("openwebtext", "wrap", 1024), "bert-base-uncased": ("lm1b", "pad", 128), "char": ("text8", "chunk", 256),
}
REFERENCE_SCHEDULES = {"loglinear": "loglinear", "cosine": "cosine", "cosinesqr": "cosine-squared"}
DATASET_NAMES = ("openwebtext", "lm1b", "text8", "wikitext103", "wikitext2", "ptb", "lambada", "ag_news")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
RUN_ROOT = TrainConfig.out_dir.split("/")[0]  # "runs": `runs/NAME` is always a local run folder


@dataclass
class Source:
    kind: str  # "hub" | "hf" (folder with config.json) | "torch" (Lightning .ckpt or a state-dict file)
    location: str


@dataclass
class Hyper:
    """Hyper-parameters a checkpoint records; None = not recorded (taken from the weights or a default)."""

    vocab_size: int | None = None
    hidden_size: int | None = None
    n_blocks: int | None = None
    n_heads: int | None = None
    cond_dim: int | None = None
    dropout: float | None = None
    length: int | None = None
    time_conditioning: bool | None = None
    schedule: str | None = None
    T: int | None = None
    tokenizer: str | None = None
    dataset: str | None = None
    packing: str | None = None
    inferred: list[str] = field(default_factory=list)


def pretrained_source(path: str | Path, which: str = "latest") -> Source | None:
    """What `path` is, if it is not an mdlm run or step folder (None: let checkpoint.py handle it)."""
    p = Path(path)
    if p.is_file():
        if p.suffix == ".safetensors" and (p.parent / "config.json").is_file():
            return Source("hf", str(p.parent))
        return None if p.suffix == ".safetensors" else Source("torch", str(p))
    if p.is_dir():
        if (p / "model.json").is_file() or (p / which).is_file():
            return None
        return Source("hf", str(p)) if (p / "config.json").is_file() else None
    text = str(path)
    # owner/name that is not a local path: not inside an existing folder, nor mdlm's run root runs/
    owner = text.split("/")[0]
    if _HUB_ID.match(text) and owner != RUN_ROOT and not Path(owner).is_dir():
        return Source("hub", text)
    return None


def load_pretrained(source: Source, *, ema: bool = True, device: torch.device | str = "cpu") -> LoadedModel:
    if source.kind == "hub":
        folder = download(source.location)
        return _from_hf_folder(folder, label=source.location, device=device)
    if source.kind == "hf":
        return _from_hf_folder(Path(source.location), label=source.location, device=device)
    return _from_torch_file(Path(source.location), ema=ema, device=device)


# ---------------------------------------------------------------------- the hub

def download(repo_id: str) -> Path:
    """A local snapshot of a hub repo's config, weights and tokeniser (from the HF cache when offline)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    from .hub import hub_offline

    hub_offline()  # without a network: switch to the local Hugging Face cache at once
    try:
        return Path(snapshot_download(repo_id, allow_patterns=HUB_FILES))
    except LocalEntryNotFoundError:
        raise MdlmError(
            f"checkpoint {repo_id!r} does not exist locally, and the Hugging Face Hub cannot be reached to "
            f"download it as a hub id; where there is a network, `hf download {repo_id} --local-dir DIR` "
            "fetches it (then pass --checkpoint DIR)") from None
    except GatedRepoError:
        raise MdlmError(f"{repo_id!r} is a gated repository on the Hugging Face Hub: accept its terms on the "
                        "website and log in with `hf auth login`") from None
    except RepositoryNotFoundError:
        raise MdlmError(f"checkpoint {repo_id!r} does not exist: not a local path, and no such model on the "
                        "Hugging Face Hub (log in with `hf auth login` if it is private)") from None
    except (HfHubHTTPError, OSError) as e:
        raise MdlmError(f"could not download {repo_id!r} from the Hugging Face Hub: {_first_line(e)}") from None


# ---------------------------------------------------------------------- Hugging Face-style folders

def _from_hf_folder(folder: Path, *, label: str, device) -> LoadedModel:
    config_file = folder / "config.json"
    try:
        raw = json.loads(config_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise MdlmError(f"{config_file} is not readable JSON ({_first_line(e)}); the checkpoint is corrupted") from None
    if not isinstance(raw, dict):
        raise MdlmError(f"{config_file} must hold a JSON object")
    if raw.get("model_type") not in (None, "mdlm"):
        raise MdlmError(f"{folder} holds a {raw['model_type']!r} model; mdlm loads MDLM (model_type 'mdlm')")
    mdlm_meta = raw.get("mdlm") if isinstance(raw.get("mdlm"), dict) else {}
    if isinstance(raw.get("config"), dict) and isinstance(raw["config"].get("model"), dict):
        hyper = hyper_from_reference(raw["config"], config_file)  # a DiT pushed with PyTorchModelHubMixin
    else:
        hyper = Hyper(
            vocab_size=_num(raw.get("vocab_size"), int, "vocab_size", config_file),
            hidden_size=_num(raw.get("hidden_dim", raw.get("hidden_size")), int, "hidden_dim", config_file),
            n_blocks=_num(raw.get("n_blocks"), int, "n_blocks", config_file),
            n_heads=_num(raw.get("n_heads"), int, "n_heads", config_file),
            cond_dim=_num(raw.get("cond_dim"), int, "cond_dim", config_file),
            dropout=_num(raw.get("dropout"), float, "dropout", config_file),
            length=_num(raw.get("model_length"), int, "model_length", config_file),
            time_conditioning=_num(raw.get("time_conditioning"), bool, "time_conditioning", config_file))
    weights_file, state = _read_hf_weights(folder)
    tokenizer_name = (mdlm_meta.get("tokenizer") or {}).get("name") or hyper.tokenizer
    state_json = dict(mdlm_meta.get("state") or {})
    state_json.update({"format": "hugging-face", "source": label, "weights": mdlm_meta.get("weights", "as stored")})
    return _assemble(backbone_state(state, weights_file), hyper, source=f"{weights_file}", path=folder,
                     tokenizer_folder=folder, tokenizer_name=tokenizer_name, shadow=None, state=state_json,
                     mdlm_meta=mdlm_meta, label=label, device=device)


def _read_hf_weights(folder: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    single, index, pickled = (folder / "model.safetensors", folder / "model.safetensors.index.json",
                              folder / "pytorch_model.bin")
    if single.is_file():
        return single, _load_weights(single)
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            raise MdlmError(f"{index} is not a valid safetensors index ({_first_line(e)})") from None
        weights: dict[str, torch.Tensor] = {}
        for shard in shards:
            weights.update(_load_weights(folder / shard))
        return index, weights
    if pickled.is_file():
        obj = read_torch_file(pickled)
        if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
            raise MdlmError(f"{pickled} does not hold a state dict of tensors")
        return pickled, obj
    raise MdlmError(f"{folder} has a config.json but no weights (model.safetensors, "
                    "model.safetensors.index.json or pytorch_model.bin)")


# ---------------------------------------------------------------------- Lightning checkpoints

def _from_torch_file(path: Path, *, ema: bool, device) -> LoadedModel:
    obj = read_torch_file(path)
    if not isinstance(obj, dict):
        raise MdlmError(f"{path} holds a {type(obj).__name__}, not a checkpoint dictionary or state dict")
    state = obj["state_dict"] if isinstance(obj.get("state_dict"), dict) else obj
    hparams = plain(obj.get("hyper_parameters") or {})
    config = hparams.get("config", hparams) if isinstance(hparams, dict) else {}
    hyper = hyper_from_reference(config, path) if isinstance(config, dict) and config else Hyper()
    ema_state = obj.get("ema")
    shadow = ema_state.get("shadow_params") if ema and isinstance(ema_state, dict) else None
    weights = "ema" if shadow is not None else ("raw" if not ema else "raw (the checkpoint holds no EMA)")
    state_json = {"format": "lightning", "source": str(path), "weights": weights}
    for key in ("global_step", "epoch"):
        if isinstance(obj.get(key), int):
            state_json["step" if key == "global_step" else key] = obj[key]
    return _assemble(backbone_state(state, path), hyper, source=str(path), path=path, tokenizer_folder=None,
                     tokenizer_name=hyper.tokenizer, shadow=shadow, state=state_json, mdlm_meta={},
                     label=path.stem, device=device)


def hyper_from_reference(config: dict, source) -> Hyper:
    """Hyper-parameters from the reference's Hydra config (`model.*`, `noise.type`, `data.*`, ...)."""
    def get(dotted: str):
        value = config
        for part in dotted.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if isinstance(value, str) and value.startswith("${"):  # an absolute interpolation, resolved once
            target = value[2:-1]
            return get(target) if value.endswith("}") and re.fullmatch(r"[\w.]+", target) and target != dotted else None
        return value

    backbone, parameterization = get("backbone"), get("parameterization")
    if backbone not in (None, "dit", "hf_dit"):
        raise MdlmError(f"{source} holds a {backbone!r} backbone; mdlm loads MDLM's DiT")
    if parameterization not in (None, "subs"):
        raise MdlmError(f"{source} was trained with parameterization={parameterization!r} (SEDD or D3PM); mdlm "
                        "applies MDLM's SUBS parameterisation, which would make it a different model")
    noise = get("noise.type")
    schedule = REFERENCE_SCHEDULES.get(noise) if noise is not None else None
    if noise == "linear" and (get("noise.sigma_min"), get("noise.sigma_max")) in ((1e-3, 7), (0.001, 7.0)):
        schedule = "linear"
    if noise is not None and schedule is None:
        raise MdlmError(f"{source} uses the noise schedule {noise!r}, which mdlm does not implement "
                        f"(supported: {', '.join(REFERENCE_SCHEDULES)}, linear with sigma 1e-3..7)")
    tokenizer = get("data.tokenizer_name_or_path")
    wrap, train = get("data.wrap"), str(get("data.train") or "")
    return Hyper(
        hidden_size=_num(get("model.hidden_size"), int, "model.hidden_size", source),
        n_blocks=_num(get("model.n_blocks"), int, "model.n_blocks", source),
        n_heads=_num(get("model.n_heads"), int, "model.n_heads", source),
        cond_dim=_num(get("model.cond_dim"), int, "model.cond_dim", source),
        dropout=_num(get("model.dropout"), float, "model.dropout", source),
        length=_num(get("model.length"), int, "model.length", source),
        time_conditioning=_num(get("time_conditioning"), bool, "time_conditioning", source),
        schedule=schedule, T=_num(get("T"), int, "T", source),
        tokenizer="char" if tokenizer == "text8" else tokenizer,
        dataset=next((name for name in DATASET_NAMES if name in train), None),
        packing=None if wrap is None else ("wrap" if wrap else "pad"))


# ---------------------------------------------------------------------- mapping onto mdlm's DiT

def backbone_state(state: dict, source) -> dict[str, torch.Tensor]:
    """The DiT's weights under mdlm's names: the reference prefix stripped (`torch.compile`'s too)."""
    tensors = {k.replace("_orig_mod.", ""): v for k, v in state.items() if isinstance(v, torch.Tensor)}
    for prefix in PREFIXES:
        if prefix + "vocab_embed.embedding" in tensors:
            return {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
    raise MdlmError(f"{source} holds no MDLM DiT weights (no 'backbone.vocab_embed.embedding'); "
                    "is it an MDLM checkpoint?")


def dit_config(weights: dict[str, torch.Tensor], hyper: Hyper, inv_freq: torch.Tensor | None, source) -> DiTConfig:
    """The config records what it records; the rest comes from the weight shapes. Where both
    exist and disagree, the strict load reports the mismatch."""
    vocab, hidden = weights["vocab_embed.embedding"].shape
    cond = weights.get("sigma_map.mlp.0.weight")
    mlp = weights.get("blocks.0.mlp.0.weight")
    indices = {int(k.split(".")[1]) for k in weights if k.startswith("blocks.") and k.split(".")[1].isdigit()}
    hidden = hyper.hidden_size or hidden
    n_heads = hyper.n_heads
    if n_heads is None and inv_freq is not None and inv_freq.numel():
        n_heads = hidden // (2 * inv_freq.numel())
        hyper.inferred.append("n_heads (from rotary_emb.inv_freq)")
    if not n_heads:
        raise MdlmError(f"{source} records no number of attention heads (no n_heads in its config, no "
                        "rotary_emb.inv_freq in its weights), so it cannot be loaded unambiguously")
    if hidden % n_heads or (hidden // n_heads) % 2:
        raise MdlmError(f"{source}: n_heads={n_heads} does not split hidden size {hidden} into even head sizes")
    return DiTConfig(
        vocab_size=hyper.vocab_size or vocab, hidden_size=hidden,
        n_blocks=hyper.n_blocks or (max(indices) + 1 if indices else 0), n_heads=n_heads,
        cond_dim=hyper.cond_dim or (cond.shape[0] if cond is not None else 128),
        mlp_ratio=mlp.shape[0] // hidden if mlp is not None and mlp.shape[0] % hidden == 0 else 4,
        dropout=0.1 if hyper.dropout is None else hyper.dropout)


def check_rotary(inv_freq: torch.Tensor | None, cfg: DiTConfig, source) -> None:
    if inv_freq is None:
        return
    head = cfg.hidden_size // cfg.n_heads
    expected = 1.0 / (10_000 ** (torch.arange(0, head, 2).float() / head))
    if inv_freq.shape != expected.shape:
        raise MdlmError(f"{source}: rotary_emb.inv_freq has {inv_freq.numel()} frequencies, but n_heads="
                        f"{cfg.n_heads} gives head size {head} ({head // 2} frequencies); config and weights disagree")
    if not torch.allclose(inv_freq.float(), expected, rtol=1e-4, atol=0.0):
        raise MdlmError(f"{source}: rotary_emb.inv_freq is not the base-10000 table mdlm computes")


def apply_ema(model: DiT, weights: dict[str, torch.Tensor], shadow, source) -> dict[str, torch.Tensor]:
    """The reference EMA is a list in `backbone.parameters()` order (then the noise module's, which
    has none); mdlm's DiT registers its parameters in the same order."""
    names = [name for name, _ in model.named_parameters()]
    if not isinstance(shadow, list | tuple) or not all(isinstance(t, torch.Tensor) for t in shadow):
        raise MdlmError(f"{source}: ema.shadow_params is not a list of tensors")
    if len(shadow) != len(names):
        raise MdlmError(f"{source}: the EMA holds {len(shadow)} tensors but this DiT has {len(names)} "
                        "parameters; the checkpoint does not fit the model its config describes")
    out = dict(weights)
    for name, tensor in zip(names, shadow, strict=True):
        expected = tuple(model.get_parameter(name).shape)
        if tuple(tensor.shape) != expected:
            raise MdlmError(f"{source}: EMA tensor for {name} has shape {tuple(tensor.shape)}, "
                            f"the model expects {expected}")
        out[name] = tensor
    return out


def _assemble(weights: dict[str, torch.Tensor], hyper: Hyper, *, source: str, path: Path,
              tokenizer_folder: Path | None, tokenizer_name: str | None, shadow, state: dict,
              mdlm_meta: dict, label: str, device) -> LoadedModel:
    inv_freq = weights.pop(INV_FREQ, None)
    cfg = dit_config(weights, hyper, inv_freq, source)
    embedding = tuple(weights["vocab_embed.embedding"].shape)
    if embedding != (cfg.vocab_size, cfg.hidden_size):  # before fetching a tokenizer for the wrong vocabulary
        raise MdlmError(f"{source}: vocab_embed.embedding has shape {embedding}, the model expects "
                        f"{(cfg.vocab_size, cfg.hidden_size)} (its config says vocab {cfg.vocab_size}, "
                        f"hidden {cfg.hidden_size})")
    tokenizer = _tokenizer(tokenizer_folder, tokenizer_name, cfg.vocab_size, source)
    if tokenizer.vocab_size != cfg.vocab_size:
        raise MdlmError(f"{source}: the tokenizer {tokenizer.name!r} has {tokenizer.vocab_size} tokens (mask "
                        f"included) but the model's vocabulary is {cfg.vocab_size}; they do not belong together")
    model = DiT(cfg)
    if shadow is not None:
        weights = apply_ema(model, weights, shadow, source)
    load_state_into(model, weights, source)
    check_rotary(inv_freq, cfg, source)
    config = mdlm_config(cfg, hyper, tokenizer, mdlm_meta, label)
    data_meta = dict(mdlm_meta.get("data") or {})
    data_meta.update({"length": config.data.length, "packing": config.data.packing,
                      "tokenizer": tokenizer.describe()})
    data_meta.setdefault("source", {"name": config.data.dataset})
    if hyper.inferred:
        state["inferred"] = hyper.inferred
    model.to(device).eval()
    return LoadedModel(path, model, config, tokenizer, data_meta, state)


def mdlm_config(cfg: DiTConfig, hyper: Hyper, tokenizer: Tokenizer, mdlm_meta: dict, label: str) -> Config:
    """mdlm's typed config for an imported model: the exporter's own when present, else the reference's."""
    dataset, packing, length = TOKENIZER_DEFAULTS.get(tokenizer.name, ("openwebtext", "wrap", 1024))
    saved = mdlm_meta.get("config") if isinstance(mdlm_meta.get("config"), dict) else {}
    saved_data = saved.get("data") or {}
    if hyper.length is None and "length" not in saved_data:
        hyper.inferred.append(f"length {length} (the reference default for {tokenizer.name})")
    model = {"hidden_size": cfg.hidden_size, "n_blocks": cfg.n_blocks, "n_heads": cfg.n_heads,
             "cond_dim": cfg.cond_dim, "dropout": cfg.dropout}
    if hyper.time_conditioning is not None:
        model["time_conditioning"] = hyper.time_conditioning
    data = {"dataset": hyper.dataset or saved_data.get("dataset", dataset),
            "packing": hyper.packing or saved_data.get("packing", packing),
            "length": hyper.length or saved_data.get("length", length), "tokenizer": tokenizer.name}
    diffusion = {k: v for k, v in (("schedule", hyper.schedule), ("T", hyper.T)) if v is not None}
    if saved:
        merged = {**saved, "data": {**saved_data, **data}, "model": {**(saved.get("model") or {}), **model},
                  "diffusion": {**(saved.get("diffusion") or {}), **diffusion}}
        try:
            return config_from_dict(merged)
        except MdlmError:
            pass  # written by another mdlm version: keep what this one understands
    return config_from_dict({"name": label.rstrip("/").split("/")[-1], "description": f"imported from {label}",
                             "data": data, "model": model, "diffusion": diffusion})


def _tokenizer(folder: Path | None, name: str | None, vocab_size: int, source) -> Tokenizer:
    """The checkpoint's own tokeniser files, else the reference tokeniser its config or vocabulary names."""
    if folder is not None and any((folder / f).is_file() for f in TOKENIZER_FILES):
        with _quiet_transformers():
            return load_tokenizer(str(folder))
    name = name or KNOWN_VOCABS.get(vocab_size)
    if name is None:
        raise MdlmError(f"{source} carries no tokenizer files and its vocabulary ({vocab_size}) is not GPT-2's "
                        "(50258), BERT's (30522) or text8's (35); put the tokenizer files next to its config.json")
    return load_tokenizer(name)


@contextmanager
def _quiet_transformers():
    """transformers warns that config.json's model_type 'mdlm' is not one of its own; that is expected."""
    logger = logging.getLogger("transformers")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _num(value, typ, name: str, source):
    if value is None:
        return None
    try:
        if typ is bool:
            if isinstance(value, bool) or value in (0, 1):
                return bool(value)
            if str(value).lower() in ("true", "false"):
                return str(value).lower() == "true"
            raise ValueError
        number = typ(value)
        if typ is int and number != float(value):
            raise ValueError
        return number
    except (TypeError, ValueError):
        raise MdlmError(f"{source}: {name} should be a {typ.__name__}, got {value!r}") from None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
