"""The BD3-LM paper's tables (Arriola et al. 2025, Tabs. 3, 4, 6, 7): fine-tunes planned after
the pre-training run they start from, the sampling settings of the reference's scripts, and the
sample-length statistics of Table 6 in the report."""

import json
import shlex

import pytest
from typer.testing import CliRunner

from mdlm_cli import recipes
from mdlm_cli.cli import app
from mdlm_cli.commands.app import command_flags
from mdlm_cli.errors import MdlmError
from mdlm_cli.recipes import plan
from mdlm_cli.recipes.plan import run_dir
from mdlm_cli.recipes.report import report_rows
from mdlm_cli.recipes.schema import Model

runner = CliRunner()


def load_recipe(name: str) -> recipes.Recipe:
    return recipes.load_recipe(name, command_flags)


def dry_run(table: str) -> list[list[str]]:
    result = runner.invoke(app, ["reproduce", table, "--dry-run"])
    assert result.exit_code == 0, result.output
    return [shlex.split(x) for x in result.output.splitlines() if not x.startswith("#")]


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


@pytest.mark.parametrize("table", ["bd3lm-table3", "bd3lm-table4"])
def test_likelihood_tables_train_the_pretraining_run_first_and_fine_tune_from_it(table):
    lines = dry_run(table)
    train = [x for x in lines if x[1] == "train"]
    presets = [flag(x, "--preset") for x in train]
    data = "lm1b" if table == "bd3lm-table3" else "owt"
    pretrain = presets.index(f"bd3lm-{data}-pretrain")
    tuned = [presets.index(f"bd3lm-{data}-{b}") for b in (16, 8, 4)]
    assert all(i > pretrain for i in tuned)
    base_run = flag(train[pretrain], "--out")
    assert flag(train[pretrain], "--max-steps") == "850000"
    for i in tuned:
        assert flag(train[i], "--set") == f"train.init_from={base_run}"
        assert flag(train[i], "--max-steps") == "150000"
    evals = [x for x in lines if x[1] == "eval-ppl"]
    runs = {flag(x, "--out") for x in train} | {"kuleshov-group/mdlm-owt"}
    assert len(evals) == 6 and all(flag(x, "--checkpoint") in runs for x in evals)
    split = "test" if data == "lm1b" else "valid"
    assert all(flag(x, "--split") == split for x in evals)
    # the diffusion rows are one-pass bounds (Suppl. C.4: a single Monte-Carlo estimate)
    assert all(flag(x, "--mc-samples") == "1" for x in evals if "-ar-" not in flag(x, "--checkpoint"))


def test_lm1b_baselines_are_retrained_on_wrapped_rows_and_values_are_the_papers():
    recipe = load_recipe("bd3lm-table3")
    for key in ("ar", "sedd", "mdlm"):
        assert recipe.models[key].overrides == ["data.packing=wrap"]
    paper = {r.name: r.paper["value"] for r in recipe.rows}
    assert paper == {"transformer-x": 23.5, "ar": 22.83, "d3pm": 82.34, "sedd": 32.68, "mdlm": 31.78,
                     "bd3lm-16": 30.60, "bd3lm-8": 29.83, "bd3lm-4": 28.23}
    assert [r.name for r in recipe.rows if r.paper_only] == ["transformer-x", "d3pm"]


def test_a_fine_tune_of_another_base_is_another_run(tmp_path):
    recipe = load_recipe("bd3lm-table4")
    tuned = recipe.models["bd3lm-4"]
    one = run_dir(tuned, tmp_path, "paper")
    tuned.base = Model("other", "bd3lm-owt-pretrain", ["optim.lr=1e-4"])
    assert run_dir(tuned, tmp_path, "paper") != one
    jobs = plan(load_recipe("bd3lm-table4"), out=tmp_path / "o", runs=tmp_path / "r", rows=["bd3lm-8"])
    assert [j.name for j in jobs if j.kind == "train"] == ["pretrain", "bd3lm-8"]
    assert jobs[0].rows == ["bd3lm-8"] and jobs[1].needs == [str(jobs[0].output)]


BASE = """title: t
models:
  base: {preset: test}
  tuned: {preset: test, init_from: base}
rows:
  - {name: a, model: tuned, steps: [{eval-ppl: {}}]}
"""


@pytest.mark.parametrize(("change", "message"), [
    (("init_from: base", "init_from: nope"), "init_from must name another model"),
    (("init_from: base", "init_from: tuned"), "init_from must name another model"),
    (("base: {preset: test}", "base: {preset: test, init_from: tuned}"), "goes round in a circle"),
    (("tuned: {preset: test,", "tuned: {checkpoint: x,"), "init_from needs a preset"),
    (("steps: [{eval-ppl: {}}]", "reduce: max, steps: [{eval-ppl: {}}]"), "goes with metric tokens"),
    (("title: t", "title: t\nmetric: tokens"), "goes with metric tokens"),
    (("steps:", "reduce: mode, steps:"), "reduce must be one of"),
])
def test_bad_fine_tunes_and_reductions_are_one_line_errors(tmp_path, change, message):
    path = tmp_path / "r.yaml"
    path.write_text(BASE.replace(*change))
    with pytest.raises(MdlmError, match=message):
        recipes.load_recipe(str(path), command_flags)


def test_slurm_fine_tunes_wait_for_their_pretraining_job(tmp_path):
    result = runner.invoke(app, ["reproduce", "bd3lm-table4", "--emit", "slurm", "--out",
                                 str(tmp_path / "t"), "--runs", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    submit = (tmp_path / "t" / "slurm" / "submit.sh").read_text().splitlines()
    trains = [x for x in submit if "train-" in x]
    waiting = [x for x in trains if "--dependency=afterok:$train_2 " in x]
    assert "train-pretrain.sbatch" in trains[2] and "--dependency" not in trains[2]
    assert sorted(x.split()[-1][:-1] for x in waiting) == [
        "train-bd3lm-16.sbatch", "train-bd3lm-4.sbatch", "train-bd3lm-8.sbatch"]


def test_generation_table_mirrors_the_reference_gen_ppl_scripts():
    lines = dry_run("bd3lm-table7")
    samples = {flag(x, "--out").split("/")[-1].split(".")[0]: x for x in lines if x[1] in ("sample", "semi-ar")}
    assert sorted(samples) == sorted(["ar-1024", "sedd-1024", "mdlm-1024", "mdlm-2048"]
                                     + [f"bd3lm-{b}-{n}" for b in (16, 8, 4) for n in (1024, 2048)])
    assert all(flag(x, "--num-samples") == "300" and "--no-stop-at-eos" in x for x in samples.values())
    for name, x in samples.items():  # Suppl. C.5: p = 0.9, SEDD 0.99 with T = 1K
        assert flag(x, "--top-p") == ("0.99" if name.startswith("sedd") else "0.9")
        assert flag(x, "--length") == name.rsplit("-", 1)[1]
    assert flag(samples["sedd-1024"], "--sampler") == "analytic" and flag(samples["sedd-1024"], "--steps") == "1000"
    assert "--sampler" not in samples["ar-1024"]  # the AR model's own left-to-right sampler
    for name in ("mdlm-1024", "mdlm-2048", "bd3lm-4-2048"):  # T = 5K first-hitting: L NFEs
        assert flag(samples[name], "--sampler") == "first-hitting" and "--steps" not in samples[name]
    assert samples["mdlm-2048"][1] == "semi-ar" and flag(samples["mdlm-2048"], "--stride") == "512"
    judged = [x for x in lines if x[1] == "gen-ppl"]
    assert len(judged) == len(samples) and all(flag(x, "--judge") == "gpt2-large" for x in judged)
    assert {flag(x, "--samples") for x in judged} == {flag(x, "--out") for x in samples.values()}
    recipe = load_recipe("bd3lm-table7")
    for key in ("ar", "sedd", "mdlm"):  # retrained without BOS/EOS rows (Suppl. C.1)
        assert recipe.models[key].overrides == ["data.packing=chunk"]
    paper = {r.name: r.paper["value"] for r in recipe.rows}
    assert (paper["bd3lm-4-1024"], paper["bd3lm-4-2048"], paper["mdlm-1024"], paper["ar-2048"]) == (
        25.7, 23.6, 46.8, 13.2)


def test_length_table_reports_the_median_and_max_of_the_samples(tmp_path):
    recipe = load_recipe("bd3lm-table6")
    out, runs = tmp_path / "o", tmp_path / "r"
    jobs = plan(recipe, out=out, runs=runs)
    sampling = [j for j in jobs if j.kind == "step"]
    assert len(sampling) == 2 and [len(j.rows) for j in sampling] == [2, 2]  # one run, two rows
    bd3 = sampling[1].argv
    assert flag(bd3, "--length") == "131008" and "--stop-at-eos" in bd3 and flag(bd3, "--top-p") == "0.9"
    out.mkdir()
    lengths = [798, 120, 9982, 800, 500]
    sampling[1].output.write_text("\n".join(
        json.dumps({"text": "x", "tokens": [1] * n, "length": n, "ended": n != 9982}) for n in lengths))
    rows = {r.name: r for r in report_rows(recipe, out=out, runs=runs, scale="paper")}
    assert rows["bd3lm-16-median"].ours == 798 and rows["bd3lm-16-max"].ours == 9982
    assert rows["bd3lm-16-max"].difference == 0 and rows["bd3lm-16-median"].extra == "5 samples, 4 ended at EOS"
    assert rows["sedd-median"].status == "pending" and rows["owt-median"].status == "quoted (not run)"


def test_tiny_scale_samples_at_the_tiny_models_length(tmp_path):
    jobs = plan(load_recipe("bd3lm-table7"), out=tmp_path / "o", runs=tmp_path / "r", scale="tiny",
                rows=["bd3lm-16-2048"])
    (sample,) = [j for j in jobs if j.argv[0] == "sample"]
    assert "--length" not in sample.argv and flag(sample.argv, "--num-samples") == "2"
