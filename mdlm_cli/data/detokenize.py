"""Detokenisers of the zero-shot sets: undo their whitespace tokenisation before BPE, as the paper's code."""

from __future__ import annotations

import re

# Undo the whitespace tokenisation of the zero-shot sets before BPE, as the paper's code.

def wikitext_detokenize(x: str) -> str:
    for a, b in ((" @-@ ", "-"), (" @,@ ", ","), (" @.@ ", "."), ("s '", "s'"),
                 (" : ", ": "), (" ; ", "; "), (" . ", ". "), (" ! ", "! "), (" ? ", "? "),
                 (" , ", ", "), ("= = = =", "===="), ("= = =", "==="), ("= =", "=="),
                 (" \n", "\n"), ("\n ", "\n"), (" N ", " 1 "), (" 's", "'s")):
        x = x.replace(a, b)
    x = re.sub(r"\(\s*([^)]*?)\s*\)", r"(\1)", x)
    x = re.sub(r"\[\s*([^\]]*?)\s*\]", r"[\1]", x)
    x = re.sub(r"{\s*([^}]*?)\s*}", r"{\1}", x)
    x = re.sub(r'"\s*([^"]*?)\s*"', r'"\1"', x)
    return x


def ptb_detokenize(x: str) -> str:
    for a, b in ((" 's", "'s"), ("s ' ", "s' "), (" n't", "n't"), (" \n ", "\n"), ("\\/", "/"),
                 ("$ 1", "$1"), ("# 1", "#1"), ("<unk>", "?")):
        x = x.replace(a, b)
    while " N " in x:
        x = x.replace(" N ", " 1 ")
    return x


def lm1b_detokenize(x: str) -> str:
    x = x.replace("http : / / ", "http://").replace("https : / / ", "https://")
    x = re.sub(r" '(\w+)", r"'\1", x)
    x = re.sub(r" (\w+) \. ", r" \1. ", x)
    x = re.sub(r" (\w+) \.$", r" \1.", x)
    for p in "?!":
        x = x.replace(f" {p} ", f"{p} ")
        x = re.sub(rf" \{p}$", p, x)
    for a, b in ((" , ", ", "), (" : ", ": "), (" ; ", "; "), (" / ", "/"), ("$ ", "$"), ("£ ", "£")):
        x = x.replace(a, b)
    x = re.sub(r'" ([^"]+) "', r'"\1"', x)
    x = re.sub(r"' ([^']+) '", r"'\1'", x)
    x = re.sub(r"\( ([^()]+) \)", r"(\1)", x)
    x = re.sub(r"\[ ([^\[\]]+) \]", r"[\1]", x)
    return x


def lambada_detokenize(x: str) -> str:
    return "\n" + x.replace("\u201c", '"').replace("\u201d", '"').strip()


def papers_detokenize(x: str) -> str:
    return lm1b_detokenize(wikitext_detokenize(x))
