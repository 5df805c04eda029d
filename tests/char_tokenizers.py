"""Test helpers shared by the server tests and the docs' blocks: a character tokeniser
(transformers' wrapper, with a chat template) over a given alphabet, and the stop of a
server subprocess."""

from __future__ import annotations

import subprocess

# the characters JSON needs (braces, quotes, the digits), lower-case text and a space
JSON_CHARS = " abcdefghijklmnopqrstuvwxyz0123456789{}[]\":,.-\\"


def chars_tokenizer(chars: str):
    """A `PreTrainedTokenizerFast` of one token a character of `chars` (after [BOS], [EOS],
    [MASK], [UNK]), joined back without spaces, with a chat template that writes each
    message's content followed by a space."""
    import tokenizers
    import transformers
    from tokenizers import decoders, models, pre_tokenizers

    vocab = {"[BOS]": 0, "[EOS]": 1, "[MASK]": 2, "[UNK]": 3}
    vocab.update({c: 4 + i for i, c in enumerate(chars)})
    raw = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Split(tokenizers.Regex("."), behavior="isolated")
    raw.decoder = decoders.Fuse()
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="[BOS]",
                                              eos_token="[EOS]", mask_token="[MASK]",
                                              unk_token="[UNK]")
    hf.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    return hf


def stop_server(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 30 s."""
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
