"""Detokenisers of the zero-shot sets: undo their whitespace tokenisation before BPE.

Each one does what the function of the same corpus in the reference's dataloader.py does,
step for step in the same order (the order matters: a later rule sees the earlier ones'
output), so Table 3 scores the same text. tests/unit/test_detokenize.py holds them to the
reference's output on lines of each corpus.
"""

from __future__ import annotations

import re

_NUMBER_SEPARATORS = ((" @-@ ", "-"), (" @,@ ", ","), (" @.@ ", "."))
_SPACE_BEFORE = ((" : ", ": "), (" ; ", "; "), (" . ", ". "), (" ! ", "! "), (" ? ", "? "),
                 (" , ", ", "))
# a pair of delimiters with the spaces inside them dropped: ( x ) -> (x), " x " -> "x"
_INNER_SPACES = tuple(re.compile(rf"{re.escape(a)}\s*([^{re.escape(b)}]*?)\s*{re.escape(b)}")
                      for a, b in (("(", ")"), ("[", "]"), ("{", "}"), ('"', '"'), ("'", "'")))
_HEADINGS = (("= = = =", "===="), ("= = =", "==="), ("= =", "=="))


def _replace_all(x: str, pairs) -> str:
    for old, new in pairs:
        x = x.replace(old, new)
    return x


def wikitext_detokenize(x: str) -> str:
    x = x.replace("s '", "s'")
    # the reference's regex here is the literal text "/' digit/" (its slashes are characters, not
    # delimiters), replaced by the literal "/'[0-9]/": kept, so that the output is the same
    x = re.sub(r"/' [0-9]/", "/'[0-9]/", x)
    x = _replace_all(x, _NUMBER_SEPARATORS + _SPACE_BEFORE)
    for pattern in _INNER_SPACES:
        x = pattern.sub(lambda m: m.group(0)[0] + m.group(1) + m.group(0)[-1], x)
    x = _replace_all(x, _HEADINGS + ((" \u00b0 ", "\u00b0"), (" \n", "\n"), ("\n ", "\n"),
                                     (" N ", " 1 "), (" 's", "'s")))
    return x


def ptb_detokenize(x: str) -> str:
    x = _replace_all(x, ((" 's", "'s"), ("s ' ", "s' "), (" n't", "n't"), (" \n ", "\n"),
                         ("\\/", "/")))
    for _ in range(10):  # ten passes, as the reference: " N N " needs two
        x = x.replace(" N ", " 1 ")
    return _replace_all(x, (("$ 1", "$1"), ("# 1", "#1"), ("<unk>", "?")))


_LM1B_QUOTES = (re.compile(r'" ([^"]+) "'), re.compile(r"' ([^']+) '"),
                re.compile(r"\( ([^()]+) \)"), re.compile(r"\[ ([^\[\]]+) \]"))


def lm1b_detokenize(x: str) -> str:
    x = x.replace("http : / / ", "http://").replace("https : / / ", "https://")
    x = re.sub(r" '(\w+)", r"'\1", x)
    x = re.sub(r" (\w+) \. ", r" \1. ", x)
    x = re.sub(r" (\w+) \.$", r" \1.", x)
    for mark in "?!":
        x = x.replace(f" {mark} ", f"{mark} ")
        x = re.sub(rf" \{mark}$", mark, x)
    x = _replace_all(x, ((" , ", ", "), (" : ", ": "), (" ; ", "; "), (" / ", "/")))
    for pattern in _LM1B_QUOTES:
        x = pattern.sub(lambda m: m.group(0)[0] + m.group(1) + m.group(0)[-1], x)
    return x.replace("$ ", "$").replace("\u00a3 ", "\u00a3")


def lambada_detokenize(x: str) -> str:
    return "\n" + x.replace("\u201c", '"').replace("\u201d", '"').strip()


def papers_detokenize(x: str) -> str:
    return lm1b_detokenize(wikitext_detokenize(x))
