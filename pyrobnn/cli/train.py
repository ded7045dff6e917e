"""``pyrobnn train``: train by SVI, write checkpoint.pt, metrics.json and reliability.png."""

from __future__ import annotations

from pathlib import Path

import pyro

from pyrobnn.analysis.evaluate import Validation
from pyrobnn.analysis.prune import principled_masks, record_sparsity
from pyrobnn.checkpoint import load_checkpoint
from pyrobnn.cli.build import beta_schedule, build, check_run, make_optimizer_factory
from pyrobnn.cli.options import RunConfig
from pyrobnn.cli.report import console, epoch_line, metrics_table, percent, say, warn
from pyrobnn.cli.runs import (
    augmentation,
    check_resume,
    gigabytes,
    load_data,
    load_states,
    test_report,
    training_accuracy,
)
from pyrobnn.device import process_peak_bytes, resolve_device
from pyrobnn.files import check_writable, write_json
from pyrobnn.infer.svi import fit

__all__ = ["train"]


def _principled_rule_applies(guide) -> bool:
    if not getattr(guide, "pruning_rule", None):
        return False
    try:
        principled_masks(guide)
    except (TypeError, ValueError, NotImplementedError):  # no weights, or no rule for this posterior
        return False
    return True


def train(cfg: RunConfig) -> dict[str, float]:
    """Train, evaluate on the test split, write ``checkpoint.pt``, ``metrics.json``, ``reliability.png``.

    Everything that can be checked without training is checked before anything is written:
    the options, ``--out``, the device and, with ``--resume``, the checkpoint and its options.
    """
    check_run(cfg)
    out = Path(cfg.output.out)
    check_writable(out, "--out", directory=True)
    device = resolve_device(cfg.optim.device)
    checkpoint = out / "checkpoint.pt"
    existing = [name for name in ("checkpoint.pt", "metrics.json") if (out / name).exists()]
    if existing and not (cfg.output.resume or cfg.output.overwrite):
        raise ValueError(f"--out {out} already holds a run ({', '.join(existing)}): pass --resume to continue it, "
                         "--overwrite to replace it, or another --out")
    resumed = None
    if cfg.output.resume and checkpoint.exists():
        resumed = load_checkpoint(checkpoint)
        check_resume(cfg, checkpoint, resumed)
    schedule = beta_schedule(cfg)
    data = load_data(cfg)
    pyro.set_rng_seed(cfg.optim.seed)  # weight initialisation
    model, guide = build(cfg, data)
    if resumed is not None:
        load_states(checkpoint, resumed, model, guide)
    elif cfg.output.resume:
        say(f"--resume: {checkpoint} does not exist; training from scratch")
    say(f"pyrobnn {cfg.data.dataset}: {len(data.x_train)} train / {len(data.x_test)} test, model {cfg.model.name}, "
        f"{len(model.sites())} Bayesian tensors, guide {cfg.guide.name}, prior {cfg.prior.name}, "
        f"beta {schedule}, estimator {cfg.optim.estimator}, device {device}")
    callbacks = [record_sparsity(guide)] if _principled_rule_applies(guide) else []
    if data.x_val is not None:
        callbacks.append(Validation(data.x_val, data.y_val))
    callbacks.append(lambda epoch, record: say(epoch_line(record, cfg.optim.epochs)))
    opt = cfg.optim
    transform = augmentation(cfg, data)
    history = fit(
        model, guide, data.x_train, data.y_train, epochs=opt.epochs, batch_size=opt.batch_size,
        optimizer=make_optimizer_factory(cfg), beta=schedule, num_particles=opt.num_particles,
        estimator=opt.estimator, seed=opt.seed, device=device, checkpoint=checkpoint, resume=cfg.output.resume,
        config=cfg.to_dict(), progress=cfg.output.progress, on_epoch_end=callbacks, transform=transform,
        precision=opt.precision,
    )
    report = {"history": history.epochs, "config": cfg.to_dict(),
              "train_peak_memory_gb": process_peak_bytes(device) / 1e9}
    write_json(out / "metrics.json", report)  # the training run is kept whatever the test report meets
    classification = data.task == "classification"
    moments, max_memory = opt.estimator == "vdp", gigabytes(cfg.output.max_memory)
    warnings = []
    if classification:
        report["train_accuracy"], chance = training_accuracy(model, guide, data, transform, moments, max_memory)
        if report["train_accuracy"] <= chance + 0.05:
            warnings.append(
                f"training accuracy {percent(report['train_accuracy'])} is at chance ({percent(chance)}, the "
                "majority class): the model learned nothing; the KL may dominate the likelihood (warm it up: "
                "--beta auto or linear with --beta.anneal), or lower --lr")
    metrics = test_report(model, guide, data, cfg.output.num_samples, opt.seed,
                          out / "reliability.png" if classification else None, moments=moments,
                          max_memory=max_memory, progress=cfg.output.progress)
    report.update(test=metrics, peak_memory_gb=process_peak_bytes(device) / 1e9, warnings=warnings)
    write_json(out / "metrics.json", report)
    console.print(metrics_table(f"test metrics ({cfg.output.num_samples} samples)", {cfg.guide.name: metrics}))
    for warning in warnings:
        warn(warning)
    say(f"peak memory {report['peak_memory_gb']:.2f} GB; wrote {out}/checkpoint.pt, metrics.json"
        + (", reliability.png" if classification else ""))
    return metrics
