"""The documentation stays true to the code: every relative link (and its #anchor) in README.md,
BENCHMARKS.md and docs/ resolves, every docs page is linked from the README, every `mdlm`
command in their shell blocks names a real subcommand and only options it has, every
`mdlm_cli` name they write exists, and every ```python block runs (tests/doc_blocks.py): on
tiny runs the test trains under the names the pages use, against a real `mdlm serve` where a
page talks to one, each page's blocks in one namespace, the results checked."""

import importlib
import json
import re
import shlex
from pathlib import Path

import pytest
import torch
import typer

from mdlm_cli.cli import app

from ..doc_blocks import (
    DEMO_AT_TEST_SIZE,
    FENCE,
    answered,
    chat_chars_run,
    get,
    python_blocks,
    run_blocks,
    serving,
    train,
)

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


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


NAME = re.compile(r"\bmdlm_cli(?:\.\w+)+")
FROM_IMPORT = re.compile(r"from (mdlm_cli(?:\.\w+)*) import (\w+(?:, *\w+)*)")
SOURCE_FILE = re.compile(r"\bmdlm_cli/[\w/]+\.py\b")


def resolve(dotted: str):
    """The module, class or function a dotted `mdlm_cli...` name is (AttributeError if none)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError as e:
            if not (e.name or "").startswith("mdlm_cli"):
                return None  # the module is there; an optional dependency of it is not
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise AttributeError(dotted)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_mdlm_cli_name_the_pages_write_exists(page):
    """`mdlm_cli.a.b.name` in prose or code, `from mdlm_cli.a import b` and `mdlm_cli/a/b.py`
    (the how-to's placeholder NAME.py aside) name modules, classes and functions that exist."""
    text = page.read_text()
    for dotted in set(NAME.findall(text)):
        try:
            resolve(dotted)
        except AttributeError:
            pytest.fail(f"{page.name}: {dotted} does not exist")
    for module, names in FROM_IMPORT.findall(text):
        for name in re.split(r", *", names):
            assert hasattr(resolve(module), name), f"{page.name}: from {module} import {name}"
    for path in SOURCE_FILE.findall(text):
        assert (ROOT / path).is_file() or path.endswith("/NAME.py"), f"{page.name}: no {path}"


# the pages whose ```python blocks run below, each with what its blocks load built first
RUN_PAGES = {"docs/python-api.md", "docs/bd3lm.md", "docs/serving.md"}
MAX_SKIPS = 2  # `<!-- doc-test: skip (reason) -->`: for what cannot run offline, kept rare


def test_every_python_block_runs_here_or_its_page_says_why_not():
    """A page with a ```python block has a test below that runs it; a block left out carries
    the skip marker, and the skips are listed (as this test's skip reason)."""
    blocks = [b for page in PAGES for b in python_blocks(page)]
    run = {str(b.page.relative_to(ROOT)) for b in blocks if b.skip is None}
    assert run == RUN_PAGES, "a page's python blocks need a test here that builds what they load"
    skipped = [b for b in blocks if b.skip is not None]
    assert len(skipped) <= MAX_SKIPS, [f"{b.page.name}:{b.line}" for b in skipped]
    if skipped:
        pytest.skip("not run, as their pages say: " + "; ".join(
            f"{b.page.relative_to(ROOT)}:{b.line} ({b.skip})" for b in skipped))


def test_the_python_api_page_runs_on_a_demo_run(tmp_path, monkeypatch):
    """docs/python-api.md loads runs/demo, what `make demo` trains: here the demo preset at a
    test size, trained into ./runs/demo first."""
    monkeypatch.chdir(tmp_path)
    train(*DEMO_AT_TEST_SIZE)
    ns: dict = {}
    printed = run_blocks(python_blocks(ROOT / "docs" / "python-api.md"), ns, {})
    loaded, tokens, nats, stats = ns["loaded"], ns["tokens"], ns["nats"], ns["stats"]
    assert loaded.path.resolve().is_relative_to((tmp_path / "runs" / "demo").resolve())
    assert loaded.objective.name == "mdlm" and loaded.length == 256
    assert ns["x0"].shape == (1, 250)  # the block's 250 characters, one token each
    nats = nats.detach()
    assert nats.shape == (1,) and bool(torch.isfinite(nats).all()) and float(nats) > 0
    assert tokens.shape == (4, 256) and not bool((tokens == loaded.mask_id).any())
    assert stats.nfe > 0 and stats.ncs > 0
    assert loaded.tokenizer.decode(tokens[0].tolist()) in printed
    # the decoder block: every masked position revealed once (first-hitting), the same rows
    assert ns["revealed"] == 4 * 256 and torch.equal(ns["event"].tokens, tokens)


def test_the_bd3lm_page_runs_on_the_run_its_command_trains(tmp_path, monkeypatch):
    """docs/bd3lm.md's Python block loads runs/test: what the page's own `mdlm train --preset
    test --set diffusion.objective=bd3lm ... --max-steps 3` writes, run here first."""
    page = ROOT / "docs" / "bd3lm.md"
    monkeypatch.chdir(tmp_path)
    command = next(args for args in shell_commands(page.read_text())
                   if args[0] == "train" and "--max-steps" in args)
    train(*command[1:])
    ns: dict = {}
    printed = run_blocks(python_blocks(page), ns, {})
    loaded, out = ns["loaded"], ns["out"]
    assert loaded.path.resolve().is_relative_to((tmp_path / "runs" / "test").resolve())
    assert loaded.objective.name == "bd3lm" and loaded.objective.block_size == 8
    assert out.tokens.shape == (2, 256)  # past the training length (32), block by block
    assert all(0 < n <= 256 for n in out.lengths.tolist())
    assert str(out.lengths) in printed


@pytest.mark.slow
def test_the_serving_page_runs_against_a_server(tmp_path):
    """docs/serving.md's blocks talk to `mdlm serve` at 127.0.0.1:8000: here a real server of a
    test-size run, on a free port the blocks' address is changed to. Its tokeniser has a chat
    template and JSON's characters, which the chat and json_schema blocks need (runs/demo's
    text8 characters have neither: chat would answer 400 `no_chat_template`)."""
    pytest.importorskip("openai")
    pytest.importorskip("uvicorn")
    pytest.importorskip("starlette")
    run = chat_chars_run(tmp_path)
    ns: dict = {}
    with serving(run, tmp_path / "server.log") as url:
        run_blocks(python_blocks(ROOT / "docs" / "serving.md"), ns,
                   {"http://127.0.0.1:8000": url})
        status, metrics = get(f"{url}/metrics")
    assert status == 200 and ns["model"] == "chat-chars"
    assert answered(metrics) == {"completions": 2, "chat": 2}  # each block's requests, served
    person = ns["person"]
    assert person == json.loads(ns["out"].choices[0].message.content)
    assert list(person) == ["name", "age", "colour"] and person["colour"] in ("red", "green")
    assert isinstance(person["age"], int) and len(person["name"]) <= 12


def test_the_skip_marker_is_read_and_a_stray_or_unknown_one_refused(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("<!-- doc-test: skip (needs the Hub) -->\n\n```python\nprint(1)\n```\n\n"
                    "```python\nprint(2)\n```\nprose `<!-- doc-test: skip (quoted) -->`\n")
    blocks = python_blocks(page)
    assert [(b.line, b.code, b.skip) for b in blocks] == [
        (4, "print(1)\n", "needs the Hub"), (8, "print(2)\n", None)]
    assert run_blocks(blocks, {}, {}) == "2\n"
    for text in ("<!-- doc-test: skip (x) -->\n```bash\nls\n```\n",
                 "<!-- doc-test: run -->\n```python\n1\n```\n"):
        page.write_text(text)
        with pytest.raises(ValueError, match="marker"):
            python_blocks(page)


def test_architecture_diagram_names_every_sample_serve_and_generation_module():
    """The diagram's boxes for sample/, serve/ and generation/ name each module of the
    package (sample/'s and serve/'s with a line each on its role)."""
    diagram = FENCE.search((ROOT / "docs" / "architecture.md").read_text()).group(2)
    for package in ("sample", "serve", "generation"):
        folder = ROOT / "mdlm_cli" / package
        box = re.search(rf"\|\s+\d+\w?\s+{package}/(.*?)\+--", diagram, re.S)
        assert box, f"the diagram has no box for {package}/"
        listed = set(re.findall(r"[\w.]+", box.group(1)))
        modules = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
        modules |= {p.name for p in folder.glob("*.html")}
        assert modules <= listed, f"{package}/ modules the diagram does not list: {modules - listed}"
