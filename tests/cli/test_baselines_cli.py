"""SWAG, MultiSWAG and SG-MCMC in ``pyrobnn train`` (``--method swag``, ``multiswag-M``, ``sghmc``): the runs write
draws.pt that ``pyrobnn evaluate`` reads back with the same numbers, ``--swag.lr`` is Maddox et al.'s schedule,
``--resume`` trains again (the moments and draws are not checkpointed), ``--grid`` scores each point by its draws,
and what a method refuses is one error line naming the options, with nothing written (a diverging rate: exit 1, no
draws)."""

from __future__ import annotations

import json

import pytest
import torch

from pyrobnn.checkpoint import load_checkpoint
from tests.infer.test_ensemble import assert_evaluate_reproduces
from tests.support import MOONS, error_line, run_cli

SWAG_RUN = ["train", *MOONS, "--method", "swag", "--lr", "0.05", "--swag.lr", "0.05", "--epochs", 4, "--swag.rank", 3,
            "--seed", 2]
SGHMC_RUN = ["train", *MOONS, "--method", "sghmc", "--lr", "0.01", "--epochs", 6, "--seed", 1]

RUNS = {  # name: (its command line, draws.pt's kind, the draws' (runs, draws), its report in metrics.json)
    "multiswag": ([*SWAG_RUN, "--method", "multiswag-2"], "swag", (2, 5),
                  {"members": 2, "draws_per_member": 5, "start": 2, "rank": 3, "collected": [2, 2],
                   "batchnorm_recomputed": False}),
    "chains": ([*SGHMC_RUN, "--sgmcmc.chains", 3], "sgmcmc", (3, 3),
               {"sampler": "sghmc", "friction": 0.1, "cycles": 0, "exploration": 0.5, "temperature": 1.0,
                "chains": 3, "draw_epochs": [4, 5, 6], "ess_min": None}),  # 3 draws a chain: no ESS
}


@pytest.fixture(scope="module", params=sorted(RUNS))
def run(request, tmp_path_factory):
    argv, kind, shape, report = RUNS[request.param]
    out = tmp_path_factory.mktemp(request.param) / "run"
    assert run_cli([*argv, "--out", out]) == 0
    return out, kind, shape, report


def test_cli_runs_write_draws_that_evaluate_reads_back(run, tmp_path, capsys):
    out, kind, shape, expected = run
    report = json.loads((out / "metrics.json").read_text())
    assert expected.items() <= report[kind].items()
    assert len(report["history"]) == shape[0] * report["config"]["optim"]["epochs"]  # every member's or chain's
    state = load_checkpoint(out / "draws.pt")
    assert state["kind"] == kind and state["draws"]["net.1.weight"].shape == (*shape, 8, 2) and "state" not in state
    assert_evaluate_reproduces(out, kind, shape[0] * shape[1], tmp_path, capsys)


def test_cli_swag_lr_sets_maddox_et_als_schedule_and_resume_trains_again(tmp_path, capsys):
    out = tmp_path / "again"
    argv = [*SWAG_RUN, "--epochs", 6, "--swag.lr", "0.01", "--swag.start", 4, "--out", out]
    assert run_cli(argv) == 0
    history = json.loads((out / "metrics.json").read_text())["history"]
    assert [round(r["lr"], 6) for r in history] == [0.05, 0.05, 0.05, 0.025, 0.01, 0.01]
    first = load_checkpoint(out / "draws.pt")["draws"]
    capsys.readouterr()
    assert run_cli([*argv, "--resume", "--overwrite"]) == 0
    assert "SWAG keeps its moments in memory" in capsys.readouterr().out
    again = load_checkpoint(out / "draws.pt")["draws"]
    assert all(torch.equal(first[k], again[k]) for k in first)  # trained again from the start: the same draws


@pytest.mark.parametrize("posterior, draws", [
    (["--method", "sgld", "--lr", "0.01", "--sgmcmc.chains", 2], (2, 2)),
    (["--method", "multiswag-2", "--lr", "0.01", "--swag.lr", "0.01", "--swag.rank", 2, "--num-samples", 3], (2, 3)),
])
def test_cli_grid_scores_each_point_by_its_draws(posterior, draws, tmp_path):
    """--grid on a regression: the noise precisions of a stack train their chains (or MultiSWAG's members) as one
    stacked network, and each point is scored by its own draws."""
    out = tmp_path / "run"
    assert run_cli(["train", "--dataset", "sinusoid", "--train-size", 60, "--test-size", 20, "--hidden", 8,
                    "--batch-size", 20, "--epochs", 4, *posterior,
                    "--grid", "tau=1,10", "--no-progress", "--out", out]) == 0
    report = json.loads((out / "metrics.json").read_text())
    assert [point["values"] for point in report["selection"]["points"]] == [{"tau": "1"}, {"tau": "10"}]
    assert load_checkpoint(out / "draws.pt")["draws"]["net.1.weight"].shape[:2] == draws


@pytest.mark.parametrize("base, argv, message", [
    (SWAG_RUN, ["--swag.rank", 0], "--swag.rank (K, the deviations kept) must be at least 2"),
    (SWAG_RUN, ["--swag.start", 4], "--swag.start 4 is at or after the last epoch (--epochs 4)"),
    (SWAG_RUN, ["--swag.start", 3], "--swag.start 3 leaves one epoch of the 4 (--epochs) to collect"),
    (SWAG_RUN, ["--optimizer", "adam"], "SWAG fits its Gaussian to SGD's iterates: --optimizer must be sgd (got adam)"),
    (SWAG_RUN, ["--swag.lr", "0.01", "--lr-step", "2"], "--swag.lr sets SWAG's learning-rate schedule: drop "
                                                         "--lr-step/--lr-linear-from"),
    (SGHMC_RUN, ["--epochs", 3, "--batch-size", 34, "--sgmcmc.cycles", 2, "--sgmcmc.exploration", "0.9"],
     "--method sghmc: no epoch of the 3 (3 steps each) ends past the exploration of its cycle"),
    (SGHMC_RUN, ["--sgmcmc.friction", 0], "friction"),
    (SGHMC_RUN, ["--sgmcmc.chains", 0], "--sgmcmc.chains must be a positive integer"),
    (SGHMC_RUN, ["--weight-decay", "0.001"], "--weight-decay 0.001 does not apply to SG-MCMC"),
    (SGHMC_RUN, ["--beta", "geometric"], "SG-MCMC samples the posterior, whose KL weight is 1: drop --beta"),
    (SGHMC_RUN, ["--guide", "normal"], "SG-MCMC (sghmc) starts from MAP fits: --guide must be point estimates"),
    (SGHMC_RUN, ["--sgmcmc.chains", 2, "--val-size", 10], "--sgmcmc.chains 2 run as one stacked network, which takes "
                                                          "no --val-size"),
    (["train", *MOONS, "--guide", "point"], ["--swag.rank", 5], "--swag.rank sets SWAG's rank: it applies to "
                                                                "--method swag or multiswag-5"),
    (["train", *MOONS, "--guide", "point"], ["--sgmcmc.temperature", "0.5"],
     "--sgmcmc.temperature sets SGMCMC's temperature: it applies to --method sgld or sghmc or csghmc"),
])
def test_cli_bad_settings_are_one_line_and_write_nothing(base, argv, message, tmp_path, capsys):
    out = tmp_path / "run"
    assert run_cli([*base, *argv, "--out", out]) == 2
    assert message in error_line(capsys)
    assert not out.exists()


@pytest.mark.parametrize("base", [SWAG_RUN, SGHMC_RUN])
def test_cli_a_diverging_rate_stops_and_says_so_without_draws(base, tmp_path, capsys):
    out = tmp_path / "run"
    assert run_cli([*base, "--lr", "1e6", "--out", out]) == 1
    assert "training diverged: loss became" in error_line(capsys)
    assert not (out / "draws.pt").exists() and not (out / "metrics.json").exists()
