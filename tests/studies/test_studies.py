"""Studies: cells as cached ``pyrobnn train`` command lines, crossed with seeds, run serially, on a process pool or a
Dask cluster, resumed, forced, and refused with one line when the study is wrong."""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path

import pytest

from pyrobnn.__main__ import main
from pyrobnn.cli import parse_config
from pyrobnn.cli.methods import method_args
from pyrobnn.cli.options import RunConfig
from pyrobnn.studies import Study, cache, executors, rebuild_report
from pyrobnn.studies.aggregate import flatten
from pyrobnn.studies.cells import NOT_IN_KEY, accepted_options, cache_key, make_cell, parse_cell
from pyrobnn.studies.report import mean_se
from tests.support import ROOT

TOY = ["--dataset", "two-moons", "--train-size", "60", "--test-size", "40", "--hidden", "8", "--epochs", "1",
       "--num-samples", "4", "--batch-size", "30"]


def study() -> Study:
    return Study(base=TOY, vary={"guide": ["normal", "dropout"]}, seeds=2, name="toy")


def numbers(records) -> list[dict]:
    return [{"label": r["label"], "seed": r["seed"], **flatten(r["metrics"])} for r in records]


def key(*argv: str) -> str:
    return cache_key("train", parse_config(RunConfig, [*TOY, *argv], "pyrobnn train"))


@pytest.fixture
def counted(monkeypatch):
    """The cells each run executes in this process, by folder name."""
    ran = []
    run_cell = executors.run_cell

    def counting(task):
        ran.append(Path(task.directory).name)
        return run_cell(task)

    monkeypatch.setattr(executors, "run_cell", counting)
    return ran


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    """A study of 2 guides x 2 seeds run serially: its folder and records."""
    out = tmp_path_factory.mktemp("study") / "toy"
    return out, study().run(out, progress=False)


# ----------------------------------------------------------------------------- cache keys


def test_cache_key_changes_exactly_when_the_configuration_does():
    same = {key(), key("--device", "cpu"), key("--data-root", "/elsewhere"), key("--no-progress"),
            key("--max-memory", "1"), key("--out", "runs/a"), key("--overwrite"), key("--resume"),
            cache_key("train", parse_config(RunConfig, [*TOY[2:], *TOY[:2]], "pyrobnn train"))}  # order
    assert len(same) == 1
    changed = [key("--epochs", "2"), key("--num-samples", "5"), key("--lr", "0.01"), key("--guide", "dropout"),
               key("--seed", "1"), key("--hidden", "8", "8"), key("--prior.scale", "0.5"), key("--beta", "constant")]
    assert len(set(changed)) == len(changed) and same.isdisjoint(changed)
    assert set(NOT_IN_KEY) <= set(accepted_options("train"))  # the list names real options


def test_cells_are_train_command_lines_with_axes_after_the_base():
    cells = Study(base=[*TOY, "--guide", "point"], vary={"guide": ["normal", "dropout"], "hidden": ["4", "8 8"]},
                  seeds=2).cells()
    assert [c.label for c in cells[:3]] == ["guide=normal hidden=4"] * 2 + ["guide=normal hidden=8 8"]
    assert [c.seed for c in cells[:2]] == [0, 1] and len({c.key for c in cells}) == 8
    cell = cells[2]
    assert cell.argv[-7:] == ("--guide", "normal", "--hidden", "8", "8", "--seed", "0")  # the axis wins
    assert shlex.split(cell.replay(Path("runs/x")))[:2] == ["pyrobnn", "train"]


def test_a_method_axis_puts_the_preset_before_the_base_which_wins():
    mcdropout, point = Study(base=TOY, vary={"method": ["mcdropout", "map"]}).cells()
    assert point.label == "map" and shlex.split(point.replay(Path("r")))[:4] == ["pyrobnn", "train", *TOY[:2]]
    config = parse_cell("train", point.argv)
    assert config.guide.name == "point" and config.output.num_samples == 4  # the preset says 1, the base 4
    assert parse_cell("train", mcdropout.argv).guide.name == "dropout"


def test_a_method_that_samples_becomes_an_mcmc_cell_with_the_options_it_shares():
    cell = make_cell(TOY, {"method": "nuts"}, {"seed": 1}, "nuts")
    assert cell.command == "mcmc" and cell.seed == 1
    assert "--epochs" not in cell.argv and "--num-samples" not in cell.argv  # train's, not NUTS's draws
    config = parse_cell("mcmc", cell.argv)
    preset = method_args("nuts")
    assert config.model.hidden == (8,) and config.mcmc.num_samples == int(preset[preset.index("--num-samples") + 1])


def test_a_base_that_names_the_sampling_method_sets_its_draws_and_a_train_base_does_not():
    """``--num-samples`` means predictive samples to ``pyrobnn train`` and draws per chain to ``pyrobnn mcmc``: a base
    with ``--method nuts`` (studies/uci_nuts.toml) was written for mcmc and sets the draws (it was once dropped
    silently, and the preset's 500 ran); a label's own settings for nuts set them too; a train base's does not."""
    sampling = ["--method", "nuts", "--dataset", "cubic", "--hidden", "8", "--num-samples", "7", "--warmup", "3"]
    cell = make_cell(sampling, {}, {"seed": 0}, "nuts")
    assert cell.command == "mcmc" and parse_cell("mcmc", cell.argv).mcmc.num_samples == 7
    axis = make_cell(["--dataset", "cubic", "--hidden", "8", "--num-samples", "7"], {"method": "nuts"}, {}, "nuts")
    preset = method_args("nuts")
    assert parse_cell("mcmc", axis.argv).mcmc.num_samples == int(preset[preset.index("--num-samples") + 1])
    labelled = make_cell(["--dataset", "cubic", "--hidden", "8", "--num-samples", "7"], {"method": "nuts"}, {},
                         "nuts", settings=["--num-samples", "9"])
    assert parse_cell("mcmc", labelled.argv).mcmc.num_samples == 9


# ----------------------------------------------------------------------------- running, caching, resuming


def test_a_study_runs_every_cell_and_reports(serial):
    out, records = serial
    assert [(r["label"], r["seed"], r["status"]) for r in records] == [
        ("normal", 0, "done"), ("normal", 1, "done"), ("dropout", 0, "done"), ("dropout", 1, "done")]
    assert all(0 <= r["metrics"]["accuracy"] <= 1 and r["train_seconds"] > 0 for r in records)
    assert cache.read_records(out) == json.loads(json.dumps(records))
    assert {"study.json", "summary.md", "summary.csv", "summary.json"} <= {p.name for p in out.iterdir()}


def test_a_second_run_trains_nothing_and_a_deleted_cell_reruns_alone(serial, counted):
    out, records = serial
    assert numbers(study().run(out, progress=False)) == numbers(records) and counted == []
    (out / "cells" / records[1]["key"] / "metrics.json").unlink()  # a run killed before its test report
    again = study().run(out, progress=False)
    assert counted == [records[1]["key"]] and numbers(again) == numbers(records)
    counted.clear()
    assert numbers(study().run(out, progress=False, force=True)) == numbers(records)
    assert sorted(counted) == sorted(r["key"] for r in records)


def test_a_cell_replays_alone_and_the_report_rebuilds_from_the_cache(serial, tmp_path, counted):
    out, records = serial
    argv = shlex.split(records[2]["command"])[1:]
    argv[argv.index("--out") + 1] = str(tmp_path / "replay")
    main(argv)
    replayed = json.loads((tmp_path / "replay" / "metrics.json").read_text())
    assert flatten({**replayed["test"], "training": replayed["training"]}) == flatten(records[2]["metrics"])
    (out / "summary.md").unlink()
    main(["study", "report", str(out)])
    assert (out / "summary.md").exists() and counted == []
    assert numbers(rebuild_report(out)) == numbers(records)


def test_a_cell_that_raises_is_recorded_and_the_others_run(tmp_path):
    records = Study(base=TOY, vary={"model": ["mlp", "lenet5"]}).run(tmp_path / "s", progress=False)
    assert [r["status"] for r in records] == ["done", "failed"]
    assert records[1]["error"] and "\n" not in records[1]["error"] and records[1]["metrics"] == {}
    assert (tmp_path / "s" / "summary.md").exists()


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("argv, named", [
    (["--vary", "method=nope"], "--vary method=nope: unknown method"),
    (["--vary", "gude=normal"], "no option --gude; did you mean guide"),
    (["--vary", "guide="], "--vary guide: the axis has no values"),
    (["--vary", "guide=normal", "--seeds", "0"], "--seeds"),
    (["--vary", "guide=normal,nope"], "nope"),
    (["--vary", "seed=1,2"], "--seeds N"),
    (["--epoch", "3"], "--epoch"),
    (["--file", "{typo}"], "unknown key seed in [study]"),
    (["--file", "{axis}"], "no option --gude"),
])
def test_bad_input_is_one_line_naming_it_and_writes_nothing(argv, named, tmp_path, capsys):
    (tmp_path / "typo.toml").write_text('[study]\nseed = 3\nbase = ["--dataset", "two-moons"]\n')
    (tmp_path / "axis.toml").write_text('[study]\nbase = ["--dataset", "two-moons"]\n[vary]\ngude = ["normal"]\n')
    argv = [a.format(typo=tmp_path / "typo.toml", axis=tmp_path / "axis.toml") for a in argv]
    out = tmp_path / "study"
    with pytest.raises(SystemExit) as exit_:
        main(["study", *TOY, *argv, "--out", str(out)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and named in err[0], err
    assert not out.exists()


def test_the_example_study_file_parses():
    example = Study.from_file(ROOT / "studies" / "mnist_ablation.toml")
    assert len(example.cells()) == 3 * 2 * 3 and example.resolved_baseline() == "guide=normal estimator=sample"


# ----------------------------------------------------------------------------- executors


@pytest.mark.slow
def test_a_process_pool_and_a_dask_cluster_give_the_serial_records(serial, tmp_path):
    _, records = serial
    for executor in ("local", "dask"):
        parallel = study().run(tmp_path / executor, workers=2, executor=executor, progress=False)
        assert [r["key"] for r in parallel] == [r["key"] for r in records]
        for got, want in zip(numbers(parallel), numbers(records)):
            assert got.keys() == want.keys()
            assert all(math.isclose(got[k], want[k], rel_tol=1e-6, abs_tol=1e-9) for k in got if k != "label"), \
                executor


# ----------------------------------------------------------------------------- published figures, configurations

PUBLISHED_STUDY = """
[study]
name = "toy"
seeds = 2
default_configuration = "gpu"
base = {toy}

[configurations.cpu]
base = ["--lr", "0.01"]

[configurations.gpu]
base = ["--lr", "0.02", "--batch-size", "20"]

[vary]
guide = ["normal", "dropout"]

[published]
source = "A paper, Table 1"
normal = {{ error = 0.25, nll = 0.5 }}
"guide=dropout" = {{ accuracy = 0.9 }}
"""


def write_study_file(path: Path, **replace: str) -> Path:
    text = PUBLISHED_STUDY.format(toy=json.dumps(TOY))
    for old, new in replace.items():
        text = text.replace(old, new)
    path.write_text(text)
    return path


def test_a_configuration_adds_its_base_and_the_report_names_it_with_the_published_figures(tmp_path, capsys):
    path = write_study_file(tmp_path / "toy.toml")
    assert Study.from_file(path).configuration == "gpu"  # default_configuration
    cpu = Study.from_file(path, "cpu")
    assert cpu.configuration == "cpu" and cpu.base[-2:] == ("--lr", "0.01")
    out = tmp_path / "out"
    main(["study", "--file", str(path), "--configuration", "cpu", "--out", str(out), "--no-progress"])
    configs = [parse_cell("train", cell["argv"]) for cell in json.loads((out / "study.json").read_text())["cells"]]
    assert [c.optim.lr for c in configs] == [0.01] * 4 and {c.guide.name for c in configs} == {"normal", "dropout"}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["configuration"] == "cpu" and summary["published"]["source"] == "A paper, Table 1"
    normal = next(entry for entry in summary["labels"] if entry["label"] == "normal")
    ours = normal["metrics"]["accuracy"]
    markdown = (out / "summary.md").read_text()
    assert "# Study summary (configuration cpu)" in markdown and "Source: A paper, Table 1." in markdown
    row = next(line for line in markdown.splitlines() if line.startswith("| normal | 2 done"))
    assert f"{mean_se(ours)} (published 0.75)" in row  # error 0.25 as our accuracy, beside our mean ± se
    assert "| normal | accuracy |" in markdown and "error = 0.25" in markdown and "(published 0.5)" in row  # nll
    dropout = next(line for line in markdown.splitlines() if line.startswith("| dropout | 2 done"))
    assert "(published 0.9)" in dropout
    printed = capsys.readouterr().out
    assert "configuration cpu" in printed and "published 0.75" in printed and "A paper, Table 1" in printed
    (out / "summary.md").unlink()
    main(["study", "report", str(out)])  # rebuilt from study.json: the same figures and configuration
    assert (out / "summary.md").read_text() == markdown


@pytest.mark.parametrize("replace, named", [
    ({'normal = {': 'nope = {'}, "[published] 'nope': names no label of this study; give a label, an axis value "
                                "or NAME=VALUE; its labels are 'normal', 'dropout'"),
    ({"error = 0.25": "top1 = 0.75"}, "unknown metric 'top1'; choose one of accuracy, error"),
    ({'source = "A paper, Table 1"': ""}, "[published] needs a source"),
    ({'default_configuration = "gpu"': 'default_configuration = "tpu"'},
     "--configuration tpu: not a configuration of this study; its configurations are cpu, gpu"),
    ({"[configurations.gpu]": "[configurations.gpu]\nseeds = 3"}, "[configurations.gpu]: unknown key seeds"),
])
def test_bad_published_figures_or_configurations_are_one_error_naming_them(replace, named, tmp_path):
    path = write_study_file(tmp_path / "toy.toml", **replace)
    with pytest.raises(ValueError) as error:
        Study.from_file(path)
    assert str(error.value).startswith(f"{path}: ") and named in str(error.value)


def test_an_unknown_configuration_on_the_command_line_is_one_line_and_writes_nothing(tmp_path, capsys):
    path = write_study_file(tmp_path / "toy.toml")
    for argv, named in ((["--file", str(path), "--configuration", "tpu"], "its configurations are cpu, gpu"),
                        (["--vary", "guide=normal", "--configuration", "gpu"], "give --file STUDY.toml too")):
        with pytest.raises(SystemExit):
            main(["study", *TOY, *argv, "--out", str(tmp_path / "out")])
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and named in err[0], err
    assert not (tmp_path / "out").exists()


def test_published_keys_match_labels_axis_values_and_pairs_and_survive_a_narrowed_axis(tmp_path):
    figures = {"source": "S", "bbb": {"accuracy": 0.5}, "hidden=8 method=map": {"error": 0.1}}
    grid = Study(base=TOY, vary={"hidden": ["4", "8"], "method": ["bbb", "map"]}, published=figures)
    narrowed = grid.replace(vary={"hidden": ["8"], "method": ["map"]})
    assert narrowed.published == {"source": "S", "hidden=8 method=map": {"error": 0.1}}
    assert grid.replace(vary={"hidden": ["4"], "method": ["map"]}).published == {}
    with pytest.raises(ValueError, match="'hidden=16': names no label"):
        Study(base=TOY, vary={"hidden": ["4", "8"]}, published={"source": "S", "hidden=16": {"nll": 1.0}})


# ----------------------------------------------------------------------------- labels' settings


def test_settings_refine_a_label_after_its_preset_and_the_base_and_axes_win(tmp_path):
    settings = {"method=mcdropout": ["--guide.rate", "0.1", "--lr", "0.02"], "hidden=4 method=mcdropout":
                ["--guide.rates", "net.1.*=0"], "map": ["--prior.scale", "0.5"]}
    grid = Study(base=TOY, vary={"hidden": ["4", "8"], "method": ["mcdropout", "map"]}, settings=settings)
    configs = {cell.label: parse_cell("train", cell.argv) for cell in grid.cells()}
    small, large = configs["hidden=4 method=mcdropout"], configs["hidden=8 method=mcdropout"]
    assert small.guide.rate == large.guide.rate == 0.1 and small.optim.lr == large.optim.lr == 0.02  # preset: 0.5
    assert small.guide.rates == ("net.1.*=0",) and large.guide.rates == ()  # the more specific key adds to it
    assert configs["hidden=4 method=map"].prior.scale == 0.5 and configs["hidden=4 method=map"].guide.rate == 0.5
    # later arguments win: the base over the settings, the axis over both
    over = Study(base=[*TOY, "--lr", "0.05"], vary={"method": ["mcdropout"]},
                 settings={"mcdropout": ["--lr", "0.02"]}).cells()[0]
    assert parse_cell("train", over.argv).optim.lr == 0.05
    # a narrowed axis keeps the settings of the labels that remain, and the cells' keys change with them
    narrowed = grid.replace(vary={"hidden": ["8"], "method": ["mcdropout"]})
    assert narrowed.settings == {"method=mcdropout": ("--guide.rate", "0.1", "--lr", "0.02")}
    plain = Study(base=TOY, vary={"hidden": ["8"], "method": ["mcdropout"]}).cells()[0]
    assert narrowed.cells()[0].key != plain.key and narrowed.to_dict()["settings"]["method=mcdropout"][1] == "0.1"


def test_a_labels_grid_entries_add_to_the_base_grid():
    study = Study(base=[*TOY, "--grid", "tau=1,2"], vary={"method": ["mcdropout", "map"]},
                  settings={"map": ["--grid", "epochs=1,2", "--lr", "0.02"]})
    configs = {cell.label: parse_cell("train", cell.argv) for cell in study.cells()}
    assert configs["map"].optim.grid == ("tau=1,2", "epochs=1,2") and configs["map"].optim.lr == 0.02
    assert configs["mcdropout"].optim.grid == ("tau=1,2",)
    alone = Study(base=TOY, vary={"method": ["map"]}, settings={"map": ["--grid", "epochs=1,2"]}).cells()[0]
    assert parse_cell("train", alone.argv).optim.grid == ("epochs=1,2",)  # no base grid: the label's own


@pytest.mark.parametrize("settings, named", [
    ({"bbb": ["--lr", "0.1"]}, "[settings] 'bbb': names no label of this study"),
    ({"normal": ["--seed", "3"]}, "[settings] 'normal' sets --seed, which the study sets for each cell"),
    ({"normal": ["--method", "bbb"]}, "sets --method"),
    ({"normal": 3}, "give a list of pyrobnn train arguments"),
    ({"normal": ["--no-such-option", "1"]}, "no-such-option"),
])
def test_bad_settings_are_one_error_naming_the_key(settings, named):
    with pytest.raises(ValueError) as error:
        Study(base=TOY, vary={"guide": ["normal", "dropout"]}, settings=settings).cells()
    assert named in str(error.value)


def test_a_study_file_joins_its_settings_with_its_configurations_and_refuses_one_the_base_overrides(tmp_path):
    path = write_study_file(tmp_path / "toy.toml", **{"[published]": '[settings]\n"guide=dropout" = '
                                                      '["--guide.rate", "0.2"]\n\n[published]',
                                                      '"--batch-size", "20"]': '"--batch-size", "20"]\n'
                                                      'settings = { dropout = ["--guide.rates", "net.1.*=0"] }'})
    gpu = Study.from_file(path)
    assert gpu.settings == {"guide=dropout": ("--guide.rate", "0.2"), "dropout": ("--guide.rates", "net.1.*=0")}
    dropout = next(parse_cell("train", cell.argv) for cell in gpu.cells() if cell.label == "dropout")
    assert dropout.guide.rate == 0.2 and dropout.guide.rates == ("net.1.*=0",)
    assert Study.from_file(path, "cpu").settings == {"guide=dropout": ("--guide.rate", "0.2")}
    clash = write_study_file(tmp_path / "clash.toml", **{"[published]": '[settings]\nnormal = ["--lr", "0.3"]\n\n'
                                                         '[published]'})
    with pytest.raises(ValueError, match="'normal' sets --lr, which the base also sets .configuration gpu. and would "
                                         "override: drop one"):
        Study.from_file(clash)


def test_a_settings_key_may_name_a_label_of_another_configuration_only(tmp_path):
    path = write_study_file(tmp_path / "toy.toml", **{"[published]": '[settings]\n"guide=dropout" = '
                                                      '["--guide.rate", "0.2"]\n\n[published]',
                                                      '"--lr", "0.01"]': '"--lr", "0.01"]\nvary = { guide = '
                                                      '["normal"] }'})
    assert Study.from_file(path, "cpu").settings == {} and Study.from_file(path, "cpu").labels() == ["normal"]
    assert Study.from_file(path, "gpu").settings == {"guide=dropout": ("--guide.rate", "0.2")}
    unknown = write_study_file(tmp_path / "unknown.toml", **{"[published]": '[settings]\n"guide=point" = '
                                                             '["--lr", "0.2"]\n\n[published]'})
    with pytest.raises(ValueError, match="'guide=point': names no label of this study"):
        Study.from_file(unknown)
    own = write_study_file(tmp_path / "own.toml", **{'"--lr", "0.01"]': '"--lr", "0.01"]\nvary = { guide = '
                                                     '["normal"] }\nsettings = { dropout = ["--guide.rate", "0.2"] }'})
    with pytest.raises(ValueError, match=r"\[settings\] 'dropout': names no label .*'normal' \(configuration cpu\)"):
        Study.from_file(own)
