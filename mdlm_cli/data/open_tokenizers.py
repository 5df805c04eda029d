"""The tokenisers of the open diffusion LLMs' folders (LLaDA, Dream), built from their
`tokenizer.json` with transformers' fast tokeniser class and the special tokens and chat
template of `tokenizer_config.json`. The folder's `tokenization_*.py` is never read (Dream's
tokenizer_config.json asks for it through auto_map: only its data is used).

The special ids are the model's: the mask is config.json's `mask_token_id`, EOS / pad / BOS
its `eos_token_id` / `pad_token_id` / `bos_token_id` where it names them, and the vocabulary
is the model's embedding rows (larger than the tokeniser's: the rows past it are never drawn
by a trained model, and SUBS removes the mask).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import MdlmError
from ..io.files import read_json_object

# config.json's model_type -> the keys that give the model's embedding rows, first present wins
# (mdlm-gpt2: a GPT-2 that `mdlm convert` made a diffusion model, in mdlm's own layout)
FAMILY_VOCAB_KEYS = {"llada": ("embedding_size", "vocab_size"), "Dream": ("vocab_size",),
                     "mdlm-gpt2": ("vocab_size",)}
# tokenizer_config.json entries passed on to the fast tokeniser
SPECIAL_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token", "mask_token")


def open_model_family(folder: Path) -> str | None:
    """The model_type of a folder of one of these families, else None."""
    path = folder / "config.json"
    if not path.is_file():
        return None
    model_type = read_json_object(path).get("model_type")
    return model_type if model_type in FAMILY_VOCAB_KEYS else None


def _content(token) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    return token.get("content") if isinstance(token, dict) else token


def fast_tokenizer(folder: Path):
    from transformers import PreTrainedTokenizerFast

    if not (folder / "tokenizer.json").is_file():
        raise MdlmError(f"{folder} has no tokenizer.json; the model's own tokenizer is needed "
                        "next to its config.json")
    settings = {}
    if (folder / "tokenizer_config.json").is_file():
        settings = read_json_object(folder / "tokenizer_config.json")
    kwargs = {k: _content(settings[k]) for k in SPECIAL_KEYS if settings.get(k) is not None}
    extra = [_content(t) for t in settings.get("additional_special_tokens") or []]
    if extra:
        kwargs["additional_special_tokens"] = extra
    template = settings.get("chat_template")
    if not isinstance(template, str) and (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text()  # transformers 5 writes it apart
    if isinstance(template, str):
        kwargs["chat_template"] = template
    if isinstance(settings.get("model_max_length"), int):
        kwargs["model_max_length"] = settings["model_max_length"]
    try:
        return PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"), **kwargs)
    except Exception as e:  # noqa: BLE001 - the tokenizers library raises its own types
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise MdlmError(f"{folder / 'tokenizer.json'} is not a readable tokenizer ({first})"
                        ) from None


def open_model_tokenizer(folder: Path) -> dict:
    """The folder's fast tokeniser (`hf`) and the model's special ids and vocabulary (see the
    module): the keyword arguments of data.tokenizers.Tokenizer."""
    config = read_json_object(folder / "config.json")
    family = config.get("model_type")
    if not isinstance(config.get("mask_token_id"), int):
        raise MdlmError(f"{folder}/config.json has no integer mask_token_id; a {family} folder "
                        "names its mask token there")
    hf = fast_tokenizer(folder)
    rows = next((config[k] for k in FAMILY_VOCAB_KEYS[family] if config.get(k)), None)
    if not isinstance(rows, int):
        raise MdlmError(f"{folder}/config.json has no vocabulary size "
                        f"({' or '.join(FAMILY_VOCAB_KEYS[family])})")
    eos = config.get("eos_token_id", hf.eos_token_id)
    if eos is None:
        raise MdlmError(f"{folder}: neither config.json nor the tokenizer names an EOS token")
    bos = config.get("bos_token_id", hf.bos_token_id)
    pad = config.get("pad_token_id", hf.pad_token_id)
    return {"hf": hf, "mask_id": config["mask_token_id"], "eos_id": eos,
            "bos_id": eos if bos is None else bos, "pad_id": eos if pad is None else pad,
            "vocab_size": max(rows, len(hf))}


# what a hub id's tokeniser needs of its repository (the config names the family and the ids)
TOKENIZER_FILES = ["config.json", "tokenizer.json", "tokenizer_config.json",
                   "special_tokens_map.json"]


def hub_open_model_folder(repo_id: str) -> Path | None:
    """The local snapshot of a hub repository's config and tokeniser files when it holds a LLaDA
    or Dream model; None for any other repository, or when the Hub and the local cache cannot
    say (the caller's own loading then reports the problem)."""
    from ..io.hub import hub_offline

    hub_offline()  # without a network: the local Hugging Face cache only, at once
    try:
        from huggingface_hub import snapshot_download

        folder = Path(snapshot_download(repo_id, allow_patterns=TOKENIZER_FILES))
    except Exception:  # noqa: BLE001 - a probe: not on the Hub, not cached, no network
        return None
    return folder if open_model_family(folder) else None
