"""``pyrobnn train``: train a run's method, write checkpoint.pt, metrics.json and reliability.png.

The run is parsed once (:func:`~pyrobnn.cli.build.check_run`: its options checked, its method built), trained by
its method (:meth:`~pyrobnn.methods.Method.train`) and tested through the posterior the method returns
(:func:`~pyrobnn.cli.runs.test_report`)."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pyro

from pyrobnn.analysis.evaluate import Validation
from pyrobnn.analysis.prune import principled_masks, record_sparsity
from pyrobnn.checkpoint import load_checkpoint
from pyrobnn.cli.build import Run, check_run
from pyrobnn.cli.grid import select_hyperparameters
from pyrobnn.cli.noise import noise_record, noise_summary
from pyrobnn.cli.options import RunConfig
from pyrobnn.cli.report import calibration_line, console, epoch_line, percent, prior_name, rate, say, warn
from pyrobnn.cli.runs import (
    CALIBRATION_SEED,
    augmentation,
    calibration_split,
    check_corruptible,
    check_resume,
    check_severities,
    corrupted_report,
    gigabytes,
    load_data,
    load_ood,
    load_states,
    metrics_tables,
    posterior_record,
    report_draws,
    test_report,
    training_accuracy,
    training_record,
)
from pyrobnn.device import process_peak_bytes, resolve_device
from pyrobnn.files import check_writable, write_json
from pyrobnn.infer.recording import resolve as resolve_compile
from pyrobnn.infer.svi import Checkpoint, TrainingDiverged
from pyrobnn.methods.posterior import EmpiricalPosterior
from pyrobnn.methods.rules import warmup_note

__all__ = ["train", "finetuning_summary"]


def _principled_rule_applies(guide) -> bool:
    if not getattr(guide, "pruning_rule", None):
        return False
    try:
        principled_masks(guide)
    except (TypeError, ValueError, NotImplementedError):  # no weights, or no rule for this posterior
        return False
    return True


def finetuning_summary(run: Run, data) -> str:
    """What a pretrained network's run trains with (:data:`~pyrobnn.networks.hf.FINETUNING`'s defaults, or the
    options given): empty for another network."""
    cfg, method = run.config, run.method
    if not run.network.pretrained:
        return ""
    optimizer = method.optimizer_factory(cfg.optim.epochs)
    kl = getattr(optimizer, "kl_lr", None)
    return (f"fine-tuning with batches of {cfg.optim.batch_size}"  # the rate: the header's own entry
            + ("" if kl is None else f", the KL by SGD at {kl:g}") + f", texts of {data.input_shape[0]} tokens")


def train(cfg: RunConfig) -> dict[str, float]:
    """Train, evaluate on the test split, write ``checkpoint.pt``, ``metrics.json``, ``reliability.png``.

    Everything that can be checked without training is checked before anything is written:
    the options, the method, ``--out``, the device and, with ``--resume``, the checkpoint and its options.
    """
    started = time.monotonic()  # the run so far sizes its test report (report_draws)
    run = check_run(cfg)
    check_severities(cfg.output.corruptions)
    out = _output(cfg)
    device = resolve_device(cfg.optim.device)
    resumed = _resumed(run, out / "checkpoint.pt")
    data, held_out = calibration_split(cfg, load_data(cfg))  # --calibrate: its rows are never trained on
    run.check_rows(len(data.x_train))
    run, selection = select_hyperparameters(run, data)  # --grid: chosen on the training set's 80/20 split
    cfg = run.config
    ood = load_ood(cfg.output.ood_dataset, cfg, data) if cfg.output.ood_dataset is not None else None
    if cfg.output.corruptions:
        check_corruptible(cfg, data)
    posterior = _trained(run, data, held_out, device, out / "checkpoint.pt", resumed)
    report = _training_report(run, posterior, data, device, selection)
    write_json(out / "metrics.json", report)  # the training run is kept whatever the test report meets
    max_memory = gigabytes(cfg.output.max_memory)
    num_samples = report_draws(cfg, posterior, data, ood, held_out, time.monotonic() - started, max_memory)
    return _tested(run, posterior, data, held_out, ood, report, out, device, num_samples)


def _output(cfg: RunConfig) -> Path:
    """``--out``, checked: writable, and holding no run unless ``--resume`` or ``--overwrite``."""
    out = Path(cfg.output.out)
    check_writable(out, "--out", directory=True)
    existing = [name for name in ("checkpoint.pt", "metrics.json") if (out / name).exists()]
    if existing and not (cfg.output.resume or cfg.output.overwrite):
        raise ValueError(f"--out {out} already holds a run ({', '.join(existing)}): pass --resume to continue it, "
                         "--overwrite to replace it, or another --out")
    return out


def _resumed(run: Run, checkpoint: Path):
    """The checkpoint ``--resume`` continues (checked against the run's options), None for a run trained anew."""
    if not (run.config.output.resume and checkpoint.exists()) or run.method.restarts:
        return None
    resumed = load_checkpoint(checkpoint)
    check_resume(run.config, checkpoint, resumed)
    return resumed


def _trained(run: Run, data, held_out, device, checkpoint: Path, resumed):
    """The run's posterior: its model and guide built (seeded by ``--seed``), the resumed state loaded, the header
    printed, and its method's training (a divergence names the rate it trained at)."""
    cfg, method, opt = run.config, run.method, run.config.optim
    pyro.set_rng_seed(opt.seed)  # weight initialisation
    model, guide = run.build(data)
    if resumed is not None:
        load_states(checkpoint, resumed, model, guide)
    elif cfg.output.resume and method.restarts and checkpoint.exists():
        say(f"--resume: {method.restarts} in memory, not in {checkpoint}; training again from the start")
    elif cfg.output.resume:
        say(f"--resume: {checkpoint} does not exist; training from scratch")
    trained_at = rate(method, model, opt.epochs)
    say(_header(run, model, data, held_out, device, trained_at))
    note = warmup_note(method.schedule(opt.epochs), opt.epochs)
    if note:
        say(f"beta: {note}")
    callbacks = [record_sparsity(guide)] if _principled_rule_applies(guide) else []
    if data.x_val is not None:
        callbacks.append(Validation(data.x_val, data.y_val))
    callbacks.append(lambda epoch, record: say(epoch_line(record, opt.epochs)))

    def member(m: int):
        say(f"{method.run_name} {m + 1}/{method.runs} (seed {opt.seed + m})")
        return run.build(data)

    if method.runs > 1:
        say(f"{method.run_name} 1/{method.runs} (seed {opt.seed})")  # the run's own model and guide
    try:
        return method.train(
            model, guide, data.x_train, data.y_train, epochs=opt.epochs, seed=opt.seed, precision=opt.precision,
            make_member=member, compile=opt.compile, device=device, progress=cfg.output.progress,
            checkpoint=Checkpoint(checkpoint, resume=cfg.output.resume and not method.restarts, config=cfg.to_dict()),
            on_epoch_end=callbacks, transform=augmentation(cfg, data))
    except TrainingDiverged as error:  # the rate the run trained at, and the option that sets it
        raise TrainingDiverged(f"{error} The run trained at {trained_at} (--lr sets it).", error.replica) from None


def _header(run: Run, model, data, held_out, device, trained_at: str) -> str:
    """The line that says what the run trains: data, model, guide, prior, β, estimator, rate, device, executor,
    noise."""
    cfg = run.config
    steps = cfg.optim.epochs * math.ceil(len(data.x_train) / cfg.optim.batch_size)
    executor, why = resolve_compile(cfg.optim.compile, device, steps)
    calibrating = "" if held_out is None else f" / {len(held_out[0])} held out to calibrate"
    noise = noise_summary(cfg, model, run.method)
    tuning = finetuning_summary(run, data)
    return (f"pyrobnn {cfg.data.dataset}: {len(data.x_train)} train{calibrating} / {len(data.x_test)} test, model "
            f"{cfg.model.name}, {len(model.sites())} Bayesian tensors, guide {cfg.guide.name}, prior "
            f"{prior_name(cfg.prior)}, beta {run.method.schedule(cfg.optim.epochs)}, estimator "
            f"{cfg.optim.estimator}, {trained_at}, device {device}, compile {executor} ({why}), report draws "
            f"{cfg.output.num_samples or 'sized to the run after training'}" + (f", {noise}" if noise else "")
            + (f", {tuning}" if tuning else ""))


def _training_report(run: Run, posterior, data, device, selection) -> dict:
    """What ``metrics.json`` holds of the training: the history, the configuration, the executor, the memory, the
    ``--grid`` search and the noise (printed when learned)."""
    cfg, history = run.config, posterior.history
    report = {"history": history.epochs, "config": cfg.to_dict(), "compile": history.compile,
              "compile_reason": history.compile_reason, "train_peak_memory_gb": process_peak_bytes(device) / 1e9}
    if selection is not None:
        report["selection"] = selection
    noise = noise_record(cfg, posterior.model, data)
    if noise is not None:
        report["noise"] = noise
        if noise["learned"]:
            units = (f" ({noise['scale_in_target_units']:.4g} in the target's units)"
                     if "scale_in_target_units" in noise else "")
            say(f"noise: learned scale {noise['scale']:.4g}{units}")
    return report


def _tested(run: Run, posterior, data, held_out, ood, report: dict, out: Path, device, num_samples: int) -> dict:
    """The posterior's test report of ``num_samples`` draws (clean, calibrated, out of distribution, corrupted),
    written into ``report`` (``metrics.json``) and printed; an empirical posterior's draws written to ``draws.pt``."""
    cfg, seed = run.config, run.config.optim.seed
    classification = data.task == "classification"
    max_memory = gigabytes(cfg.output.max_memory)
    draws = 10 if cfg.output.num_samples else min(10, num_samples)  # no more than a report sized to the run
    warnings = _learned_something(posterior, data, run, report, max_memory, draws) if classification else []
    if isinstance(posterior, EmpiricalPosterior):  # its draws replace the fit they started from
        posterior.save(out / "draws.pt", config=cfg.to_dict())
        say(f"{posterior.kind}: {posterior.result.summary()}; wrote {out}/draws.pt")
        report[posterior.kind] = posterior.report
    metrics = test_report(posterior, data, seed, out / "reliability.png" if classification else None,
                          max_memory=max_memory, progress=cfg.output.progress, ood=ood, held_out=held_out,
                          coverage=cfg.calibration.coverage, num_samples=num_samples)
    report["training"] = training_record(report)
    recorded = posterior_record(posterior)
    if recorded:
        report["posterior"] = recorded
    if held_out is not None:
        report["calibration"] = {"rows": len(held_out[0]), "fraction": cfg.calibration.fraction,
                                 "coverage": cfg.calibration.coverage, "seed": CALIBRATION_SEED}
        say(calibration_line(metrics, len(held_out[0]), cfg.calibration.coverage))
    corrupted = None
    if cfg.output.corruptions:  # the means over the corruptions in the test report, each corruption beside it
        shifted = corrupted_report(posterior, cfg, data, cfg.output.corruptions, cfg.output.corruption_types,
                                   num_samples, seed, max_memory, cfg.output.progress)
        corrupted = shifted["mean"]
        metrics["corrupted"] = {"mean": corrupted, "severities": shifted["severities"]}
        report["corruptions"] = shifted["corruptions"]
    report.update(test=metrics, peak_memory_gb=process_peak_bytes(device) / 1e9, warnings=warnings)
    write_json(out / "metrics.json", report)
    name = cfg.method or (posterior.kind if isinstance(posterior, EmpiricalPosterior) else cfg.guide.name)
    for table in metrics_tables(f"test metrics ({num_samples} samples)", name, metrics, corrupted):
        console.print(table)
    for warning in warnings:
        warn(warning)
    say(f"peak memory {report['peak_memory_gb']:.2f} GB; wrote {out}/checkpoint.pt, metrics.json"
        + (", reliability.png" if classification else ""))
    return metrics


def _learned_something(posterior, data, run: Run, report: dict, max_memory, draws: int) -> list[str]:
    """The training accuracy in ``report`` (``draws`` draws), and a warning when it is at chance."""
    report["train_accuracy"], chance = training_accuracy(posterior, data, augmentation(run.config, data), max_memory,
                                                         draws=draws)
    if report["train_accuracy"] > chance + 0.05:
        return []
    return [f"training accuracy {percent(report['train_accuracy'])} is at chance ({percent(chance)}, the majority "
            "class): the model learned nothing; the KL may dominate the likelihood (warm it up: --beta auto or linear "
            "with --beta.anneal), or lower --lr"]
