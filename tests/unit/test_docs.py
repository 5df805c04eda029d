"""The documentation stays true to the code: every relative link (and its #anchor) in README.md,
BENCHMARKS.md and docs/ resolves, every docs page is linked from the README, and every `mdlm`
command in their shell blocks names a real subcommand and only options it has."""

import re
import shlex
from pathlib import Path

import pytest
import typer

from mdlm_cli.cli import app

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def prose(text: str) -> str:
    """The page without its fenced code blocks (links there are not links)."""
    return FENCE.sub("", text)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in prose(path.read_text()).splitlines():
        if line.startswith("#"):
            base = slug(line.lstrip("#"))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        assert dest.is_file(), f"{page.name}: {target} names no file"
        if anchor:
            assert anchor in anchors(dest), f"{page.name}: {target}: no such heading in {dest.name}"


def test_every_docs_page_is_linked_from_the_readme():
    readme = prose((ROOT / "README.md").read_text())
    for page in (ROOT / "docs").glob("*.md"):
        assert f"(docs/{page.name}" in readme, page.name


def shell_commands(text: str):
    """The `mdlm ...` and `-m mdlm_cli ...` command lines of the shell blocks, as argument lists
    after the subcommand's position (continuation lines joined, comments dropped)."""
    for lang, body in FENCE.findall(text):
        if lang not in ("bash", "sh"):
            continue
        for line in body.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            for i, word in enumerate(words):
                if word == "mdlm" or (word == "mdlm_cli" and i and words[i - 1] == "-m"):
                    yield words[i + 1:]
                    break


def option_names(command) -> set[str]:
    options = [p for p in command.params if p.param_type_name == "option"]
    return {name for p in options for name in p.opts + p.secondary_opts} | {"--help"}


def test_shell_blocks_use_real_commands_and_options():
    root = typer.main.get_command(app)
    checked = 0
    for page in PAGES:
        for args in shell_commands(page.read_text()):
            if not args or args[0].startswith("-"):
                continue
            command = root.commands.get(args[0])
            assert command is not None, f"{page.name}: mdlm {args[0]} is no command"
            names = option_names(command)
            for word in args[1:]:
                flag = word.split("=", 1)[0]
                if flag.startswith("-") and not re.fullmatch(r"-\d.*", flag):
                    assert flag in names, f"{page.name}: mdlm {args[0]} has no option {flag}"
            checked += 1
    assert checked > 100  # the pages show 120 commands: a parser that found none would pass


def _one_line(path: Path) -> str:
    return " ".join(path.read_text().split())


def test_sampling_doc_names_each_objectives_default_sampler():
    """docs/sampling.md's list of the samplers a checkpoint uses without --sampler is the
    objectives' registry (`default_sampler`)."""
    from mdlm_cli.objectives import OBJECTIVES

    text = _one_line(ROOT / "docs" / "sampling.md")
    listed = re.search(r"uses its objective's own \((.*?)\);", text).group(1)
    named = dict((o, s) for s, o in re.findall(r"`([a-z0-9-]+)` for ([A-Z0-9]+)", listed))
    assert named == {n.upper(): o.default_sampler for n, o in OBJECTIVES.items()
                     if o.default_sampler}


def test_architecture_diagram_lists_the_registries():
    """The boxed diagram atop docs/architecture.md names every objective of OBJECTIVES (and
    no other) and every checkpoint format of FORMATS (its module's name)."""
    from mdlm_cli.checkpoints.formats.registry import FORMATS
    from mdlm_cli.objectives import OBJECTIVES

    diagram = FENCE.search((ROOT / "docs" / "architecture.md").read_text()).group(2)
    objectives = re.search(r"objectives/\s+(.*?)\s+\[OBJECTIVES\]", diagram).group(1)
    assert [x.strip() for x in objectives.split(",")] == list(OBJECTIVES)
    box = re.search(r"\|\s+8\s+checkpoints/(.*?)\+--", diagram, re.S).group(1)
    missing = [n for n in FORMATS if n.replace("-", "_") not in re.findall(r"\w+", box)]
    assert not missing, f"formats the diagram does not list: {missing}"


def test_sample_help_names_the_demo_models_samplers():
    """`mdlm sample --help`'s first examples name what runs/demo (the demo preset) samples with:
    its objective's default, and the sampler `--steps` alone picks."""
    from mdlm_cli.build import resolve_config
    from mdlm_cli.commands.sample import SAMPLE_HELP
    from mdlm_cli.data.tokenizers import load_tokenizer
    from mdlm_cli.objectives import get_objective

    cfg = resolve_config("demo", [])
    objective = get_objective(cfg, load_tokenizer(cfg.data.tokenizer))
    lines = SAMPLE_HELP.splitlines()
    default = next(x for x in lines if x.strip().startswith("mdlm sample   "))
    stepped = next(x for x in lines if x.strip().startswith("mdlm sample --steps 1000 "))
    assert default.endswith(f", {objective.choose_sampler(None, None).spec.name}")
    assert f"({objective.choose_sampler(None, 1000).spec.name}" in stepped
