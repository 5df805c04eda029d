"""The shape of the package, as the house style asks: no import cycles (function-level imports
included), short functions and modules, and no objective or sampler name compared outside its
registry."""

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2] / "mdlm_cli"


def modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def imports(name: str, path: pathlib.Path, known: dict, type_level: bool = False) -> set[str]:
    """The package's modules `name` imports, at any depth of its code; the TYPE_CHECKING blocks
    only with `type_level` (a type-level import is no runtime cycle, but it is a dependency)."""
    tree = ast.parse(path.read_text())
    typing_only = set() if type_level else {
        id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
        and getattr(block.test, "id", None) == "TYPE_CHECKING" for n in ast.walk(block)}
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only or not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            targets = [".".join(base + ([node.module] if node.module else []) + [a.name]) for a in node.names]
            targets += [".".join(base + ([node.module] if node.module else []))]
        else:
            targets = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
        for target in targets:
            while target and target not in known and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in known and target != name:
                found.add(target)
    return found


def test_no_import_cycles():
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def test_functions_and_modules_stay_short():
    long_functions, long_files = [], []
    for path in ROOT.rglob("*.py"):
        text = path.read_text()
        if len(text.splitlines()) > 400:
            long_files.append(f"{path.name}: {len(text.splitlines())}")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno >= 60:
                long_functions.append(f"{path.name}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1}")
    assert not long_functions and not long_files, (long_functions, long_files)


def width(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """A function's parameters: self / cls not counted, *args and **kwargs one each."""
    a = node.args
    named = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in ("self", "cls")]
    return len(named) + (a.vararg is not None) + (a.kwarg is not None)


def test_functions_outside_the_commands_take_at_most_eight_parameters():
    """STYLE.md's width: more than 8 means a type is missing (a request, settings, a layout).
    The commands are exempt: a Typer command's parameters are its flags."""
    wide = [f"{p.relative_to(ROOT)}:{node.lineno} {node.name}: {width(node)}"
            for p in ROOT.rglob("*.py") if "commands" not in p.relative_to(ROOT).parts
            for node in ast.walk(ast.parse(p.read_text()))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and width(node) > 8]
    assert not wide, wide


def test_no_objective_or_sampler_name_is_branched_on_outside_its_registry():
    pattern = re.compile(r"objective\s*==|is_autoregressive|startswith\(\"ancestral|sampler\s*==\s*\"")
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in ROOT.rglob("*.py")
            for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not hits, hits


# The layers of docs/architecture.md, bottom first: a module may import its own layer and the
# layers below it, never one above (type-level imports included). The engine is the ground floor:
# it imports nothing of mdlm outside itself.
LAYERS = (
    ("mdlm_cli.engine",),
    ("mdlm_cli.errors",),
    ("mdlm_cli.config", "mdlm_cli.numbers"),
    ("mdlm_cli.runtime", "mdlm_cli.perf", "mdlm_cli.distributed", "mdlm_cli.signals", "mdlm_cli.memory", "mdlm_cli.io"),
    ("mdlm_cli.data",),
    ("mdlm_cli.models",),
    ("mdlm_cli.objectives",),
    ("mdlm_cli.build",),
    ("mdlm_cli.checkpoints",),
    ("mdlm_cli.generation",),
    ("mdlm_cli.eval",),
    ("mdlm_cli.sample",),
    ("mdlm_cli.rl",),
    ("mdlm_cli.train",),
    ("mdlm_cli.tasks",),
    ("mdlm_cli.serve",),
    ("mdlm_cli.recipes",),
    ("mdlm_cli.commands", "mdlm_cli.cli", "mdlm_cli.__main__"),
)


def layer_of(module: str) -> int | None:
    for i, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return i
    return None  # the package itself (mdlm_cli/__init__.py: the version only)


def test_every_module_sits_in_a_layer_and_imports_only_its_own_or_lower_ones():
    known = modules()
    unplaced = [m for m in known if m != "mdlm_cli" and layer_of(m) is None]
    assert not unplaced, f"modules in no layer (add them to LAYERS and docs/architecture.md): {unplaced}"
    upward = []
    for name, path in known.items():
        mine = layer_of(name)
        for target in imports(name, path, known, type_level=True):
            theirs = layer_of(target)
            if mine is not None and theirs is not None and theirs > mine:
                upward.append(f"{name} -> {target}")
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(sorted(upward))


def test_no_line_runs_past_100_characters():
    """The house style's width (ruff's E501 at line-length 100 checks it too, in `make lint`)."""
    long_lines = [f"{p.relative_to(ROOT)}:{i}" for p in ROOT.rglob("*.py")
                  for i, line in enumerate(p.read_text().splitlines(), 1) if len(line) > 100]
    assert not long_lines, long_lines


def _lines_without_docstring(node: ast.FunctionDef) -> int:
    lines = node.end_lineno - node.lineno + 1
    first = node.body[0]
    is_doc = isinstance(first, ast.Expr) and isinstance(getattr(first, "value", None), ast.Constant)
    return lines - (first.end_lineno - first.lineno + 1 if is_doc else 0)


def test_commands_parse_call_one_function_and_print():
    """A command's function (its options included, its help text not) fits in 40 lines: the
    work lives in the layer below, where the Python API reaches it too."""
    long_commands = []
    for path in (ROOT / "commands").glob("*.py"):
        for node in ast.parse(path.read_text()).body:
            decorated = isinstance(node, ast.FunctionDef) and any(
                "command" in ast.unparse(d) for d in node.decorator_list)
            if decorated and _lines_without_docstring(node) > 40:
                long_commands.append(f"{path.name}:{node.name}: {_lines_without_docstring(node)}")
    assert not long_commands, long_commands


# modules that once typed their own copy of the tokenisers' vocabulary sizes (and disagreed)
VOCAB_READERS = ("checkpoints/pretrained.py", "checkpoints/formats/assemble.py",
                 "checkpoints/formats/sedd.py", "recipes/cost.py", "train/memory_check.py")


def test_no_vocabulary_size_is_retyped_outside_the_tokenizer_registry():
    """data/tokenizers.TOKENIZERS is the one place a known tokeniser's vocabulary size is written.
    Anywhere in the package, a size of four digits or more (or it less one: the vocabulary
    before an appended mask) is a copy, in code or in a message; in the modules that used to
    keep copies, every registry size is."""
    from mdlm_cli.data.tokenizers import TOKENIZERS

    sizes = {t.vocab_size for t in TOKENIZERS.values()}
    distinctive = {s - k for s in sizes if s >= 1000 for k in (0, 1)}
    hits = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "data/tokenizers.py":
            continue
        wanted = distinctive | (sizes if rel in VOCAB_READERS else set())
        tree = ast.parse(path.read_text())
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, ast.Module | ast.FunctionDef | ast.ClassDef) and n.body
                      and isinstance(n.body[0], ast.Expr)}  # examples, not values the code uses
        for node in ast.walk(tree):
            if not isinstance(node, ast.Constant) or id(node) in docstrings:
                continue
            if type(node.value) is int and node.value in wanted or isinstance(node.value, str) \
                    and any(re.search(rf"\b{s}\b", node.value) for s in wanted):
                hits.append(f"{rel}:{node.lineno} {node.value!r}")
    assert not hits, f"vocabulary sizes typed outside data/tokenizers.TOKENIZERS: {hits}"


def test_no_two_modules_import_each_other_even_for_types():
    """A type-level import back is no runtime cycle, but it ties two modules into one (the tie
    train/log <-> train/setup was cut by a protocol in log)."""
    known = modules()
    graph = {name: imports(name, path, known, type_level=True) for name, path in known.items()}
    ties = sorted((a, b) for a in graph for b in graph[a] if a < b and a in graph.get(b, ()))
    packages = {n for n, p in known.items() if p.name == "__init__.py"}
    ties = [(a, b) for a, b in ties if a not in packages and b not in packages]
    assert not ties, f"modules that import each other: {ties}"


def _doc_paragraphs() -> list[str]:
    doc = (ROOT.parent / "docs" / "architecture.md").read_text()
    return re.split(r"\n\s*\n", doc)


def test_every_module_is_named_in_the_architecture_doc():
    """Each module's file name in backticks, in the paragraph of docs/architecture.md whose
    bold heading names its top package (a top-level module: anywhere in the doc)."""
    paragraphs, missing = _doc_paragraphs(), []
    whole = "\n".join(paragraphs)
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.name == "__init__.py":
            continue
        named = f"`{rel.name}`"
        if len(rel.parts) == 1:
            found = named in whole or f"`{rel.stem}`" in whole
        else:
            heading = f"`{rel.parts[0]}/`"
            found = any(p.startswith("**") and heading in p.split("**")[1] and named in p
                        for p in paragraphs)
        if not (found or f"`{rel}`" in whole):  # or by its path (`io/files.py`)
            missing.append(str(rel))
    assert not missing, f"modules docs/architecture.md does not place: {missing}"


def _sampler_names_in(node: ast.AST, names: set[str]) -> set[str]:
    found = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Constant) and isinstance(n.value, str):
            found |= set(re.findall(r"[a-z][a-z0-9-]*", n.value)) & names
    return found


def test_no_registry_of_samplers_is_retyped_outside_it():
    """A string list or an option's help naming 3+ SAMPLERS keys retypes the registry (and goes
    stale when a sampler is added): derive it from `SAMPLERS` / the objectives instead. An
    objective's own `sampler_names` (which samplers serve it) is its registry entry."""
    from mdlm_cli.engine.sampling import SAMPLERS

    names, retyped = set(SAMPLERS), []
    for path in sorted(ROOT.rglob("*.py")):
        if path.relative_to(ROOT).parts[0] == "engine":
            continue
        tree = ast.parse(path.read_text())
        own = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Assign)
               and any(getattr(t, "id", None) == "sampler_names" for t in n.targets)}
        for node in ast.walk(tree):
            if isinstance(node, ast.List | ast.Tuple | ast.Set) and id(node) not in own:
                hit = _sampler_names_in(node, names)
            elif isinstance(node, ast.keyword) and node.arg == "help":
                hit = _sampler_names_in(node.value, names)
            else:
                continue
            if len(hit) >= 3:
                retyped.append(f"{path.relative_to(ROOT)}:{node.value.lineno if isinstance(node, ast.keyword) else node.lineno} {sorted(hit)}")
    assert not retyped, f"sampler names retyped outside the registry: {retyped}"


def option_aliases() -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """The commands' option aliases (module-level `Name = Annotated[..., typer.Option(...)]`, or
    names unpacked from a function that makes them): name -> the files defining it, and
    declaration -> the statements (their names) that make it."""
    files: dict[str, list[str]] = {}
    declarations: dict[str, list[str]] = {}
    for path in sorted((ROOT / "commands").glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.Assign):
                continue
            value = ast.unparse(node.value)
            if not ("typer.Option(" in value or "_options(" in value):
                continue
            names = [n.id for t in node.targets for n in (t.elts if isinstance(t, ast.Tuple)
                                                          else [t])]
            for name in names:
                files.setdefault(name, []).append(path.name)
            declarations.setdefault(value, []).append(", ".join(names))
    return files, declarations


def test_every_option_alias_is_defined_once_and_shared_ones_in_options():
    """One name per flag and one flag per name: no alias defined in two files, no two names for
    one declaration, an alias another command module uses lives in options.py, and no option is
    declared inline in a signature."""
    files, declarations = option_aliases()
    assert len(files) > 100  # the parse found them
    twice = {name: where for name, where in files.items() if len(where) > 1}
    assert not twice, f"option aliases defined in more than one file: {twice}"
    twins = [names for names in declarations.values() if len(names) > 1]
    assert not twins, f"one option declared under several names: {twins}"
    for path in sorted((ROOT / "commands").glob("*.py")):
        tree = ast.parse(path.read_text())
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        for name in used & set(files):
            assert files[name][0] in (path.name, "options.py"), (
                f"{path.name} uses {name} of {files[name][0]}: shared aliases go in options.py")
        inline = [a.arg for a in ast.walk(tree) if isinstance(a, ast.arg) and a.annotation
                  and "typer.Option(" in ast.unparse(a.annotation)]
        assert not inline, f"{path.name}: options declared in a signature: {inline}"


def test_one_partial_result_class_for_every_checkpoint_format():
    """A format's reader fills base.Partial; a format's own partial-result class would be a
    second shape of the same hand-off."""
    found = [f"{path.relative_to(ROOT)}:{name}" for path in sorted((ROOT / "checkpoints").rglob("*.py"))
             for name in re.findall(r"^class (\w*Partial\w*)", path.read_text(), re.M)]
    assert found == ["checkpoints/formats/base.py:Partial"], found
