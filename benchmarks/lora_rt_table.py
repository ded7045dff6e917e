"""The tables of ``studies/lora_rt.toml`` (issue 59) from a finished study's ``summary.json``: printed as Markdown,
and with ``--results FILE`` written as ``results/*.json`` tables (:mod:`docs._ext.results_data`'s format, which
renders them into ``RESULTS.md``), the published DALorRA figures beside them.

- ``lora-rt``: each method's accuracy and ECE (in %), NLL and Brier, in-domain (Rotten Tomatoes) and on the shift
  (IMDB), mean ± standard error over the seeds, with the paired difference to MAP-LoRA and its 95 % interval;
- ``lora-rt-why``: the paired ratios to MAP-LoRA of ECE and NLL (geometric mean, 95 % interval from the log ratios),
  and what was measured about why: the training NLL, the mean epistemic entropy in-domain and shifted, BLoB's
  learned sigma on A (mean and spread over its weights), map-ts's temperature.

    python benchmarks/lora_rt_table.py OUT/lora_rt
    python benchmarks/lora_rt_table.py OUT/lora_rt --results results/lora_rt.json --commit abc1234 \\
        --machine "one H100, 8 cells at a time" --wall "6 min 40 s for the 30 cells" --command "benchmarks/gpu.sh OUT"
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from pyrobnn.studies.report import difference_text, mean_se, ratio_text

SECTION = "Bayesian fine-tuning where MAP over-fits (issue 59)"

VALUES = {  # column -> (the study's metric, label, better, scale)
    "accuracy": ("accuracy", "accuracy %", "higher", 100),
    "ece": ("ece", "ECE %", "lower", 100),
    "nll": ("nll", "NLL", "lower", 1),
    "brier": ("brier", "Brier", "lower", 1),
    "shift_accuracy": ("ood.shifted.accuracy", "IMDB accuracy %", "higher", 100),
    "shift_ece": ("ood.shifted.ece", "IMDB ECE %", "lower", 100),
    "shift_nll": ("ood.shifted.nll", "IMDB NLL", "lower", 1),
    "shift_brier": ("ood.shifted.brier", "IMDB Brier", "lower", 1),
}
RATIOS = {  # column -> (the study's metric, label)
    "ece_ratio": ("ece", "ECE / MAP's"),
    "shift_ece_ratio": ("ood.shifted.ece", "IMDB ECE / MAP's"),
    "nll_ratio": ("nll", "NLL / MAP's"),
    "shift_nll_ratio": ("ood.shifted.nll", "IMDB NLL / MAP's"),
}
DIAGNOSTICS = {  # column -> (the study's metric, label, better)
    "train_nll": ("training.nll", "training NLL", None),
    "epistemic": ("epistemic", "epistemic (nats)", None),
    "shift_epistemic": ("ood.shifted.epistemic", "IMDB epistemic (nats)", None),
    "sigma_mean": ("posterior.sigma.mean", "sigma on A: mean", None),
    "sigma_std": ("posterior.sigma.std", "sigma on A: std", None),
    "temperature": ("posterior.temperature", "temperature", None),
    "prior_precision": ("posterior.prior_precision", "Laplace prior precision", None),
    "cell_seconds": ("train_seconds", "cell (s)", "lower"),
}
PUBLISHED = {  # DALorRA (arXiv 2607.02182), Tables 1 and 5: ACC % / ECE % / NLL over six commonsense tasks
    "Llama-3.1-8B": {"MAP-LoRA": ("84.67", "12.66", "0.770"), "MC dropout": ("85.23", "11.22", "0.670"),
                     "deep ensemble": ("85.84", "10.24", "0.558"), "Laplace-LoRA": ("84.47", "5.51", "0.777"),
                     "BLoB (10 draws)": ("84.50", "4.70", "0.432")},
    "Llama-2-7B": {"MAP-LoRA": ("77.68", "19.68", "1.617"), "MC dropout": ("77.70", "18.50", "1.488"),
                   "deep ensemble": ("78.58", "17.70", "1.297"), "Laplace-LoRA": ("75.96", "25.41", "0.792"),
                   "BLoB (10 draws)": ("76.54", "6.01", "0.557")},
}
SOURCE = "DALorRA (arXiv 2607.02182), Tables 1 and 5: LoRA on {model}, averaged over six commonsense tasks"


def _scaled(summary: dict, scale: float) -> dict:
    """A summary or difference with every figure multiplied by ``scale``."""
    return {key: value * scale if isinstance(value, float) and key not in ("n", "level") else value
            for key, value in summary.items()}


def _seeds(entry: dict) -> int:
    return max((m["n"] for m in entry["metrics"].values()), default=0)


def rows(summary: dict) -> tuple[list[dict], list[dict]]:
    """The two tables' rows ``{"id", "values", "differences"}`` (figures as RESULTS.md writes them)."""
    values, why = [], []
    for entry in summary["labels"]:
        method = entry["axes"].get("method", entry["label"])
        row = {"id": method, "values": {}, "differences": {}}
        for column, (metric, _, _, scale) in VALUES.items():
            if metric in entry["metrics"]:
                row["values"][column] = mean_se(_scaled(entry["metrics"][metric], scale))
                difference = (entry["difference"] or {}).get(metric)
                if difference is not None:
                    row["differences"][column] = difference_text(_scaled(difference, scale), interval=True)
        values.append(row)
        row = {"id": method, "values": {}, "differences": {}}
        for column, (metric, _) in RATIOS.items():
            ratio = (entry.get("ratio") or {}).get(metric)
            if ratio is not None and ratio["ratio"] is not None:
                row["values"][column] = f"{ratio['ratio']:.3g}"
                row["differences"][column] = ratio_text(ratio).partition(" ")[2] or "1 pair"
        for column, (metric, _, _) in DIAGNOSTICS.items():
            found = entry["metrics"].get(metric)
            if found is not None and math.isfinite(found["mean"]):
                row["values"][column] = mean_se(found)
        why.append(row)
    return values, why


def markdown(header: list[str], table_rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in table_rows])


def _cell(row: dict, column: str) -> str:
    value = row["values"].get(column, "")
    difference = row["differences"].get(column)
    return f"{value} ({difference})" if value and difference else value


def text(summary: dict) -> str:
    values, why = rows(summary)
    seeds = max((_seeds(entry) for entry in summary["labels"]), default=0)
    parts = [f"mean ± standard error over {seeds} seeds; in parentheses: paired difference to map [95 % t interval], "
             "* where it excludes 0", "",
             markdown(["method", *(label for _, label, _, _ in VALUES.values())],
                      [[row["id"], *(_cell(row, c) for c in VALUES)] for row in values]), "",
             "paired ratio to map: geometric mean [95 % interval from the log ratios], * where it excludes 1; then "
             "what was measured about why (mean ± standard error over the seeds)", "",
             markdown(["method", *(label for _, label in RATIOS.values()),
                       *(label for _, label, _ in DIAGNOSTICS.values())],
                      [[row["id"], *(_cell(row, c) for c in (*RATIOS, *DIAGNOSTICS))] for row in why]), "",
             "published (" + SOURCE.format(model="Llama-3.1-8B / Llama-2-7B") + "): ACC % / ECE % / NLL", "",
             markdown(["method", *PUBLISHED],
                      [[name, *(" / ".join(PUBLISHED[model][name]) for model in PUBLISHED)]
                       for name in PUBLISHED["Llama-3.1-8B"]])]
    return "\n".join(parts) + "\n"


def results(summary: dict, provenance: dict) -> dict:
    """The ``results/*.json`` document of the two tables, the published figures as rows of the first."""
    values, why = rows(summary)
    seeds = max((_seeds(entry) for entry in summary["labels"]), default=0)
    published = [{"id": f"{model.lower().replace('.', '')}-{name.split()[0].lower()}", "label": f"{name}, {model}",
                  "published": True, "source": SOURCE.format(model=model),
                  "values": {"accuracy": acc, "ece": ece, "nll": nll},
                  "no_se": "published as one figure"}
                 for model, methods in PUBLISHED.items() for name, (acc, ece, nll) in methods.items()]
    common = {"section": SECTION, **provenance, "statistic": f"mean ± standard error over {seeds} seeds"}
    return {"description": "all-MiniLM-L6-v2 (hf:minilm-l6, frozen) with LoRA r 8 on query and value, fine-tuned on "
                           "Rotten Tomatoes sentences of 48 tokens until MAP's training NLL nears 0; tested on other "
                           "sentences and on IMDB reviews (their first 48 tokens) as the shift (studies/lora_rt.toml).",
            "tables": [
                {"id": "lora-rt", "title": "Bayesian fine-tuning where MAP over-fits: Rotten Tomatoes in, IMDB shifted",
                 **common, "difference": "paired difference to map [its 95 % t interval], * where it excludes 0",
                 "metrics": {column: {"label": label, "better": better}
                             for column, (_, label, better, _) in VALUES.items()},
                 "rows": values + published},
                {"id": "lora-rt-why", "title": "Where MAP over-fits: ratios to MAP-LoRA, and why",
                 **common, "difference": "the ratio's 95 % interval (from the paired log ratios), * where it "
                                         "excludes 1",
                 "no_se": "a ratio is the geometric mean of the paired ratios, its interval beside it",
                 "metrics": {**{column: {"label": label, "better": "lower"} for column, (_, label) in RATIOS.items()},
                             **{column: {"label": label, **({"better": better} if better else {})}
                                for column, (_, label, better) in DIAGNOSTICS.items()}},
                 "rows": why}]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", type=Path, help="the study's folder (its --out), holding summary.json")
    parser.add_argument("--results", type=Path, help="write the tables as this results/*.json file")
    for key in ("command", "commit", "machine", "wall"):
        parser.add_argument(f"--{key}", default="")
    args = parser.parse_args()
    path = args.study / "summary.json"
    if not path.is_file():
        parser.error(f"{path} does not exist: give the folder of a finished study (pyrobnn study report DIR writes "
                     "it from the cells done)")
    summary = json.loads(path.read_text())
    print(text(summary), end="")
    if args.results is not None:
        provenance = {key: getattr(args, key) for key in ("command", "commit", "machine", "wall")}
        if not all(provenance.values()):
            parser.error("--results needs --command, --commit, --machine and --wall (every figure's provenance)")
        args.results.write_text(json.dumps(results(summary, provenance), indent=1, ensure_ascii=False) + "\n")
        print(f"wrote {args.results}")


if __name__ == "__main__":
    main()
