"""`mdlm reproduce --report`: the paper's numbers beside ours, read from the steps' outputs."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from .plan import result_file, run_dir, scale_label
from .schema import Recipe, Row


@dataclass
class ReportRow:
    name: str
    label: str
    paper: float | None
    paper_source: str
    ours: float | None
    ours_se: float | None
    extra: str  # e.g. the entropy next to a gen PPL
    status: str  # done | pending | quoted (not run)
    steps: str  # training steps / tokens of the model
    hardware: str

    @property
    def difference(self) -> float | None:
        return None if self.paper is None or self.ours is None else self.ours - self.paper


def _records(path: Path) -> list[dict]:
    """The records of a step's JSON output: eval-ppl and bench-sampler hold a `results` list,
    lm-eval a `results` mapping task -> metrics, glue a `tasks` list; a samples file (.jsonl,
    sample and semi-ar) one record per line."""
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    data = json.loads(path.read_text())
    results = data.get("results")
    if isinstance(results, list):
        return results
    if isinstance(results, dict):  # lm-eval: one record per task, named by `task` (for `pick`)
        return [{"task": task, **metrics} for task, metrics in results.items()]
    return data["tasks"] if isinstance(data.get("tasks"), list) else [data]


def _value(recipe: Recipe, row: Row, record: dict) -> tuple[float | None, float | None, str]:
    """(value, standard error, extra) of one output record, in the recipe's metric."""
    m = recipe.metric
    if m == "gen_ppl":  # a gen-ppl record, or a bench-sampler row with --judge (its "quality")
        quality = record.get("quality") or record
        entropy = quality.get("entropy_mean", quality.get("entropy", float("nan")))
        return quality.get("gen_ppl"), None, f"entropy {entropy:.3f}"
    if m == "mauve":  # gen-ppl with --mauve-reference, or a bench-sampler row (its "quality")
        q = record.get("quality") or record
        mauve = record.get("mauve") if isinstance(record.get("mauve"), dict) else q
        sd = mauve.get("mauve_sd")
        sd = "" if sd is None else f"± {sd:.3f} (k-means seeds), "
        return mauve.get("mauve"), None, f"{sd}gen PPL {q.get('gen_ppl', float('nan')):.2f}"
    if m == "seconds":  # bench-sampler's seconds_per_sample, or a sample's seconds (per sample)
        seconds = record.get("seconds_per_sample", record.get("seconds"))
        return seconds, None, f"NFE {record.get('nfe', float('nan')):.0f}"
    if m == "accuracy" and row.score is not None:  # the row's lm-eval key, e.g. a filter's
        metric, _, kept = row.score.partition(",")
        stderr = record.get(f"{metric}_stderr,{kept}")
        return record.get(row.score), stderr if isinstance(stderr, float) else None, (
            f"lm-eval {row.score}")
    if m == "accuracy" and "best" not in record:  # lm-eval's acc (and stderr), or a glue task's
        if "acc,none" in record:
            return record["acc,none"], record.get("acc_stderr,none"), "lm-eval acc"
        mismatched = (record.get("mismatched") or {}).get(record.get("metric"))  # MNLI's mm
        mm = "" if mismatched is None else f"; mismatched {mismatched:.4f} (m/mm)"
        return record.get("value"), None, str(record.get("metric", "")) + mm
    if (
        m == "accuracy"
    ):  # mdlm classify: the best setting's test accuracy, mean and max - min over seeds / folds
        best = record.get("best", {})
        spread, std = best.get("test_accuracy_max_minus_min"), best.get("test_accuracy_std")
        over = f" over {best['over']}" if "over" in best else ""
        extra = "" if spread is None else f"± {spread:.3f} (max - min{over})"
        extra += "" if std is None else f", std {std:.3f}"
        return best.get("test_accuracy_mean"), None, extra
    if m == "variance":
        # eval-ppl: the mean over sequences of their variance across the K passes
        value = record.get("sequence_var")
        relation = "≤" if record.get("kind") == "bound" else "="
        return value, None, f"PPL {relation} {record.get('perplexity', 0):.2f}"
    exact = record.get("kind") == "exact"
    se = None if exact else record.get("standard_error")
    if exact:
        return _in_metric(m, record), None, "exact"
    if m == "bpc":
        return record.get("bits_per_char"), None if se is None else se / math.log(2), ""
    if m == "nats":
        return record.get("nats_per_token"), se, ""
    ppl = record.get("perplexity")
    ppl_se = None if se is None or ppl is None else ppl * se  # d exp(x) = exp(x) dx
    if recipe.statistic == "std":
        return ppl, None, _pass_spread(record, ppl_se)
    return ppl, ppl_se, ""


def _lengths(row: Row, records: list[dict]) -> tuple[float, None, str]:
    """The row's `reduce` (median, max, mean) of the samples' lengths in tokens: a sample cut at
    EOS records its `length`, a whole row counts all its tokens."""
    lengths = [r["length"] if r.get("length") is not None else len(r.get("tokens") or [])
               for r in records]
    reduce = {"median": statistics.median, "max": max, "mean": statistics.fmean}[row.reduce]
    ended = sum(bool(r.get("ended")) for r in records)
    return float(reduce(lengths)), None, f"{len(lengths)} samples, {ended} ended at EOS"


def _pass_spread(record: dict, ppl_se: float | None) -> str:
    """The std over the K passes of each pass's perplexity (a paper's "std over K evaluation
    seeds": one seed is one pass), the standard error of the mean beside it."""
    passes = [math.exp(min(p, 700.0)) for p in record.get("passes") or []]
    if len(passes) < 2:
        return "std: one pass"
    mean = sum(passes) / len(passes)
    std = math.sqrt(sum((p - mean) ** 2 for p in passes) / (len(passes) - 1))
    se = "" if ppl_se is None else f", SE {ppl_se:.2g}"
    return f"std {std:.2g} over {len(passes)} passes{se}"


def _in_metric(metric: str, record: dict) -> float | None:
    key = {"bpc": "bits_per_char", "nats": "nats_per_token"}.get(metric, "perplexity")
    return record.get(key)


def _pick(records: list[dict], pick: dict) -> dict | None:
    chosen = [r for r in records if all(str(r.get(k)) == str(v) for k, v in pick.items())]
    return chosen[0] if chosen else None


def _training(
    recipe: Recipe, row: Row, runs: Path, scale: str, jobs_log: dict
) -> tuple[str, str]:
    model = recipe.models[row.model]
    folder = Path(run_dir(model, runs, scale))
    if model.stands_in_for is not None:  # mdlm reproduce --model: a local folder instead
        return f"{model.checkpoint}, standing in for {model.stands_in_for}", ""
    if model.checkpoint is not None:
        return f"published {model.checkpoint}", ""
    try:
        latest = (folder / "latest").read_text().strip()
        state = json.loads((folder / "checkpoints" / latest / "state.json").read_text())
        steps = f"{state['step']:,} steps / {state['tokens_seen']:,} tokens"
    except (OSError, KeyError, json.JSONDecodeError):
        return "not trained", jobs_log.get(model.key, "")
    # a run trained outside `mdlm reproduce` (or by an earlier one) still says how long it took
    seconds = state.get("train_seconds")
    fallback = f"{seconds / 60:.1f} min (the run's own record)" if seconds else ""
    return steps, jobs_log.get(model.key, fallback)


def report_rows(recipe: Recipe, *, out: Path, runs: Path, scale: str) -> list[ReportRow]:
    jobs_log = _hardware(out)
    rows = []
    for row in recipe.rows:
        paper = row.paper.get("value")
        source = str(row.paper.get("source", ""))
        if row.paper_only:
            rows.append(
                ReportRow(
                    row.name, row.label, paper, source, None, None, "", "quoted (not run)",
                    "", "",
                )
            )
            continue
        steps, hardware = _training(recipe, row, runs, scale, jobs_log)
        path = result_file(recipe, row, out=out, runs=runs, scale=scale)
        records = [r for r in _records(path) if _pick([r], row.pick)] if path.is_file() else []
        record = records[0] if records else None
        if record is None:
            rows.append(
                ReportRow(
                    row.name, row.label, paper, source, None, None, "", "pending", steps,
                    hardware,
                )
            )
            continue
        if recipe.metric == "tokens":  # a statistic over every sample, not one record
            value, se, extra = _lengths(row, records)
        else:
            value, se, extra = _value(recipe, row, record)
        if row.paper.get("disagrees"):  # the sources give two values for this measurement
            disagree = f"sources disagree: {row.paper['disagrees']}"
            extra = f"{extra}; {disagree}" if extra else disagree
        rows.append(
            ReportRow(row.name, row.label, paper, source, value, se, extra, "done", steps,
                      hardware)
        )
    return rows


def write_report(recipe: Recipe, *, out: Path, runs: Path, scale: str) -> list[ReportRow]:
    """The report's rows, written to OUT/report.md beside the paper's numbers."""
    rows = report_rows(recipe, out=out, runs=runs, scale=scale)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(markdown(recipe, rows, scale_label(scale)))
    return rows


def _hardware(out: Path) -> dict[str, str]:
    """Model key -> where and how long its training ran, from the jobs log of `mdlm
    reproduce`."""
    found = {}
    log = out / "jobs.jsonl"
    if log.is_file():
        for line in log.read_text().splitlines():
            try:
                job = json.loads(line)
            except json.JSONDecodeError:
                continue
            if job.get("kind") == "train" and job.get("returncode") == 0:
                found[job["name"]] = (
                    f"{job.get('device', '?')}, {job.get('seconds', 0) / 60:.1f} min"
                )
    return found


def fmt(value: float | None, se: float | None = None) -> str:
    """A report value (± its standard error) as the Markdown and the terminal table show it."""
    if value is None:
        return ""
    text = f"{value:.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    return text + (f" ± {se:.2g}" if se is not None else "")


def markdown(recipe: Recipe, rows: list[ReportRow], scale_text: str) -> str:
    lines = [
        f"# {recipe.title}",
        "",
        f"Paper numbers: {recipe.source}. Ours: {scale_text}; metric `{recipe.metric}`"
        + (
            " (diffusion values are upper bounds)"
            if recipe.metric in ("ppl", "bpc", "nats")
            else ""
        )
        + ".",
        "",
        *([f"Stand-ins (mdlm reproduce --model / --task): {'; '.join(recipe.stand_ins)}.", ""]
          if recipe.stand_ins else []),
        "| row | paper | ours | difference | | training | hardware | status |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.label} | {fmt(r.paper)} | {fmt(r.ours, r.ours_se)} | {fmt(r.difference)} "
            f"| {r.extra} | {r.steps} | {r.hardware} | {r.status} |"
        )
    sources = sorted({r.paper_source for r in rows if r.paper_source})
    lines += ["", "Sources of the paper's numbers: " + "; ".join(sources) + "."
              if sources else ""]
    if recipe.notes:
        lines += ["", recipe.notes.strip()]
    return "\n".join(lines).rstrip() + "\n"


def plot(recipe: Recipe, rows: list[ReportRow], path: Path, *, runs: Path, scale: str) -> bool:
    """A PNG for the tables that are curves; False when the recipe has none or nothing to
    draw."""
    if recipe.plot is None:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    if recipe.plot == "loss":
        for key, model in recipe.models.items():
            metrics = Path(run_dir(model, runs, scale)) / "metrics.jsonl"
            if metrics.is_file():
                records = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
                points = [(r["tokens"], r["loss"]) for r in records if "loss" in r]
                if points:
                    ax.plot(*zip(*points, strict=True), label=key)
        ax.set_xlabel("training tokens")
        ax.set_ylabel("training loss (nats/token)")
    else:
        by_row = {r.name: r for r in rows}
        for series in sorted({row.series or "" for row in recipe.rows}):
            members = sorted(
                (row for row in recipe.rows
                 if (row.series or "") == series and row.x is not None),
                key=lambda row: row.x,
            )
            points = [
                (row.x, by_row[row.name].ours)
                for row in members
                if by_row[row.name].ours is not None
            ]
            if points:
                ax.plot(*zip(*points, strict=True), "o-", label=series or recipe.metric)
        ax.set_xscale("log")
        ax.set_ylabel(recipe.metric)
    ax.set_title(recipe.title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True
