"""The recipe format, loaded and validated against the config dataclasses and the CLI.

    title: "Table 8: ..."
    source: "where the paper's numbers come from"
    metric: ppl            # what a row reports: ppl | bpc | nats | gen_ppl | mauve | seconds |
                           # variance | accuracy | tokens (a statistic of the samples' lengths,
                           # each row's `reduce`: median | max | mean)
    plot: loss             # optional: loss (training curves) | series (rows' values against `x`)
    statistic: std         # optional: se (default: ± the standard error) | std (the spread over
                           # the K Monte-Carlo passes, as a paper reporting "std over K seeds")
    needs: "network for LM1B; judges: none"
    models:                # training runs (or published checkpoints) the rows evaluate
      mdlm: {preset: lm1b, set: [diffusion.T=1000], max_steps: 1000000}
      published: {checkpoint: kuleshov-group/mdlm-owt}
      base: {preset: bd3lm-owt-pretrain}
      tuned: {preset: bd3lm-owt-4, init_from: base}  # fine-tunes base's run (trained first)
    rows:
      - name: mdlm
        label: "MDLM"
        model: mdlm
        # commands run on the model, in order; the last one's output is the row's result
        steps:
          - eval-ppl: {mc-samples: 1}
        # optional: which record of the output (eval-ppl, bench-sampler, lm-eval's task)
        pick: {dataset: lambada}
        # optional, metric accuracy: which key of an lm-eval record is the row's value, as
        # lm-eval names it (metric,filter); default acc,none
        score: "exact_match,flexible-extract"
        paper: {value: 27.04, source: "Tab. 8, MDLM"}
        # optional: paper.disagrees: "..." says which source gives another value for the
        # same measurement; the report prints it beside the row
      - {name: ssd, label: "SSD-LM", paper_only: true, paper: {value: 35.43, source: "Tab. 5"}}

Step arguments are the command's own flags without the dashes; `{run}` is the row's model's run
folder (or checkpoint), `{runs[KEY]}` any model's, `{out}` the table's output folder, `{row}` the
row's name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..build import resolve_config
from ..config import load_preset, preset_dir
from ..errors import MdlmError

METRICS = ("ppl", "bpc", "nats", "gen_ppl", "mauve", "seconds", "variance", "accuracy", "tokens")
# metric tokens: what a row reports of its samples' lengths
REDUCTIONS = ("median", "max", "mean")
PLOTS = ("loss", "series")
STATISTICS = ("se", "std")  # what a row's spread is: standard error of the mean, or the std
# commands a step may run; the runner adds --checkpoint and the output file where they take one
STEP_COMMANDS = ("eval-ppl", "gen-ppl", "sample", "semi-ar", "bench-sampler", "classify", "glue",
                 "lm-eval")


@dataclass
class Model:
    key: str
    preset: str | None = None
    overrides: list[str] = field(default_factory=list)
    max_steps: int | None = None
    checkpoint: str | None = None  # a published model instead of a training run
    # the key of the table's model whose weights this run starts from
    init_from: str | None = None
    base: Model | None = None  # that model, resolved when the recipe loads
    stands_in_for: str | None = None  # the published checkpoint a local folder replaces


@dataclass
class Step:
    command: str
    args: dict


@dataclass
class Row:
    name: str
    label: str
    model: str | None
    steps: list[Step]
    paper: dict
    pick: dict = field(default_factory=dict)
    paper_only: bool = False
    x: float | None = None  # for `plot: series`
    series: str | None = None
    reduce: str | None = None  # metric tokens: median | max | mean of the samples' lengths
    score: str | None = None  # metric accuracy: the lm-eval record's key (metric,filter)


@dataclass
class Recipe:
    name: str
    title: str
    source: str
    metric: str
    needs: str
    models: dict[str, Model]
    rows: list[Row]
    plot: str | None = None
    notes: str = ""
    statistic: str = "se"
    # what stands in for the hub (stand_in.py)
    stand_ins: list[str] = field(default_factory=list)


def tables_dir() -> Path:
    return preset_dir() / "tables"


FlagsOf = Callable[
    [str], set[str]
]  # an mdlm command -> its option names (commands.common.command_flags)


def list_recipes(flags_of: FlagsOf) -> dict[str, Recipe]:
    return {
        path.stem: load_recipe(path.stem, flags_of)
        for path in sorted(tables_dir().glob("*.yaml"))
    }


def load_recipe(name_or_path: str, flags_of: FlagsOf) -> Recipe:
    """The recipe of a shipped table or a YAML file; every step's flags are checked with
    `flags_of` (the CLI's own option names, which the command layer above passes in)."""
    path = Path(name_or_path)
    if not (path.suffix in (".yaml", ".yml") and path.is_file()):
        path = tables_dir() / f"{name_or_path}.yaml"
    if not path.is_file():
        names = ", ".join(p.stem for p in sorted(tables_dir().glob("*.yaml")))
        raise MdlmError(
            f"unknown table {name_or_path!r}; choose one of: {names} (see mdlm reproduce --list)"
        )
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise MdlmError(f"{path} is not valid YAML: {str(e).splitlines()[0]}") from None
    recipe = _recipe(path.stem, _mapping(data, str(path)), str(path))
    _check_flags(recipe, flags_of, str(path))
    return recipe


def _check_flags(recipe: Recipe, flags_of: FlagsOf, where: str) -> None:
    for i, row in enumerate(recipe.rows):
        for j, step in enumerate(row.steps):
            unknown = [flag for flag in step.args if flag not in flags_of(step.command)]
            if unknown:
                raise MdlmError(f"{where}: rows[{i}].steps[{j}]: mdlm {step.command} has no "
                                f"option --{unknown[0]}")


def _mapping(value, where: str, keys: tuple[str, ...] | None = None) -> dict:
    if not isinstance(value, dict):
        raise MdlmError(f"{where} must be a mapping")
    if keys is not None and set(value) - set(keys):
        raise MdlmError(
            f"{where}: unknown key {sorted(set(value) - set(keys))[0]!r}; valid keys: "
            f"{', '.join(keys)}"
        )
    return value


def _recipe(name: str, data: dict, where: str) -> Recipe:
    _mapping(data, where, ("title", "source", "metric", "plot", "needs", "models", "rows",
                           "notes", "statistic"))
    metric, statistic = data.get("metric", "ppl"), data.get("statistic", "se")
    if (metric not in METRICS or data.get("plot") not in (None, *PLOTS)
            or statistic not in STATISTICS):
        raise MdlmError(
            f"{where}: metric must be one of {', '.join(METRICS)}, "
            f"plot one of {', '.join(PLOTS)}, "
            f"statistic one of {', '.join(STATISTICS)}"
        )
    models = {key: _model(key, value, f"{where}: models.{key}")
              for key, value in _mapping(data.get("models") or {}, f"{where}: models").items()}
    _link_bases(models, where)
    rows = [
        _row(value, models, f"{where}: rows[{i}]")
        for i, value in enumerate(data.get("rows") or [])
    ]
    for i, row in enumerate(rows):
        if (metric == "tokens") != (row.reduce is not None) and not row.paper_only:
            raise MdlmError(f"{where}: rows[{i}] ({row.name}): reduce (one of "
                            f"{', '.join(REDUCTIONS)}) goes with metric tokens, and only "
                            "with it")
        if row.score is not None and metric != "accuracy":
            raise MdlmError(f"{where}: rows[{i}] ({row.name}): score (an lm-eval record's key) "
                            "goes with metric accuracy")
    if not rows:
        raise MdlmError(f"{where} has no rows")
    if len({r.name for r in rows}) != len(rows):
        raise MdlmError(f"{where}: row names must be unique")
    return Recipe(
        name,
        str(data.get("title", name)),
        str(data.get("source", "")),
        metric,
        str(data.get("needs", "")),
        models,
        rows,
        data.get("plot"),
        str(data.get("notes", "")),
        statistic,
    )


def _model(key: str, value, where: str) -> Model:
    value = _mapping(value, where, ("preset", "set", "max_steps", "checkpoint", "init_from"))
    if ("preset" in value) == ("checkpoint" in value):
        raise MdlmError(
            f"{where} needs exactly one of preset (a training run) or checkpoint (a published "
            "model)"
        )
    model = Model(
        key,
        value.get("preset"),
        [str(s) for s in value.get("set") or []],
        value.get("max_steps"),
        value.get("checkpoint"),
        value.get("init_from"),
    )
    if model.init_from is not None and model.preset is None:
        raise MdlmError(f"{where}: init_from needs a preset (a training run to fine-tune)")
    if model.preset is not None:
        load_preset(model.preset)  # unknown presets are errors
        resolve_config(model.preset, model.overrides)  # so are unknown keys and bad values
    return model


def _link_bases(models: dict[str, Model], where: str) -> None:
    """Resolve each `init_from` to its model; an unknown key or a cycle is an error."""
    for key, model in models.items():
        if model.init_from is None:
            continue
        if model.init_from not in models or model.init_from == key:
            others = ", ".join(k for k in models if k != key)
            raise MdlmError(f"{where}: models.{key}.init_from must name another model of the "
                            f"table (one of: {others})")
        model.base = models[model.init_from]
    for key in models:  # follow each chain: a cycle would plan forever
        seen, model = {key}, models[key]
        while model.base is not None:
            if model.init_from in seen:
                raise MdlmError(f"{where}: models.{key}: init_from goes round in a circle")
            seen.add(model.init_from)
            model = model.base


def _row(value, models: dict[str, Model], where: str) -> Row:
    value = _mapping(
        value,
        where,
        ("name", "label", "model", "steps", "paper", "pick", "paper_only", "x", "series",
         "reduce", "score"),
    )
    if value.get("reduce") not in (None, *REDUCTIONS):
        raise MdlmError(f"{where}: reduce must be one of {', '.join(REDUCTIONS)}")
    if "name" not in value:
        raise MdlmError(f"{where} needs a name")
    paper = _mapping(value.get("paper") or {}, f"{where}.paper",
                     ("value", "source", "se", "note", "disagrees"))
    if "value" in paper and not str(paper.get("source") or "").strip():
        raise MdlmError(f"{where}: paper value {paper['value']} needs a source (the seed "
                        "file and its sentence, the reference file and key, a named "
                        "transcription, or 'from nowhere')")
    row = Row(
        str(value["name"]),
        str(value.get("label", value["name"])),
        value.get("model"),
        [_step(s, f"{where}.steps[{i}]") for i, s in enumerate(value.get("steps") or [])],
        paper,
        _mapping(value.get("pick") or {}, f"{where}.pick"),
        bool(value.get("paper_only", False)),
        value.get("x"),
        value.get("series"),
        value.get("reduce"),
        None if value.get("score") is None else str(value["score"]),
    )
    if row.score is not None and "," not in row.score:
        raise MdlmError(f"{where} ({row.name}): score names an lm-eval record's key as "
                        f"metric,filter (e.g. exact_match,flexible-extract; got {row.score!r})")
    if not row.paper_only and (row.model not in models or not row.steps):
        raise MdlmError(
            f"{where} ({row.name}) needs a model (one of: {', '.join(models)}) and steps, "
            "or paper_only: true"
        )
    return row


def _step(value, where: str) -> Step:
    if not (isinstance(value, dict) and len(value) == 1):
        raise MdlmError(f"{where} must be one mapping {{command: {{flag: value}}}}")
    (command, args), = value.items()
    if command not in STEP_COMMANDS:
        raise MdlmError(
            f"{where}: unknown command {command!r}; steps run: {', '.join(STEP_COMMANDS)}"
        )
    return Step(command, dict(_mapping(args or {}, where)))
