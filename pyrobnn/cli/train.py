"""``pyrobnn train``: train by SVI, write checkpoint.pt, metrics.json and reliability.png."""

from __future__ import annotations

from pathlib import Path

import pyro

from pyrobnn.analysis.evaluate import Validation
from pyrobnn.analysis.prune import principled_masks, record_sparsity
from pyrobnn.checkpoint import load_checkpoint
from pyrobnn.cli.build import beta_schedule, build, check_run, make_optimizer_factory
from pyrobnn.cli.options import RunConfig
from pyrobnn.cli.report import console, epoch_line, metrics_table, say
from pyrobnn.cli.runs import augmentation, check_resume, load_data, load_states, test_report
from pyrobnn.device import resolve_device
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
    say(f"pyrobnn {cfg.data.dataset}: {len(data.x_train)} train / {len(data.x_test)} test, model {cfg.model.name}, "
         f"{len(model.sites())} Bayesian tensors, guide {cfg.guide.name}, prior {cfg.prior.name}, "
         f"beta {cfg.optim.beta.name}, estimator {cfg.optim.estimator}, device {device}")
    callbacks = [record_sparsity(guide)] if _principled_rule_applies(guide) else []
    if data.x_val is not None:
        callbacks.append(Validation(data.x_val, data.y_val))
    callbacks.append(lambda epoch, record: say(epoch_line(record, cfg.optim.epochs)))
    opt = cfg.optim
    history = fit(
        model, guide, data.x_train, data.y_train, epochs=opt.epochs, batch_size=opt.batch_size,
        optimizer=make_optimizer_factory(cfg), beta=schedule, num_particles=opt.num_particles,
        estimator=opt.estimator, seed=opt.seed,
        device=device, checkpoint=checkpoint, resume=cfg.output.resume, config=cfg.to_dict(),
        progress=cfg.output.progress, on_epoch_end=callbacks, transform=augmentation(cfg, data),
        precision=opt.precision,
    )
    classification = data.task == "classification"
    metrics = test_report(model, guide, data, cfg.output.num_samples, opt.seed,
                           out / "reliability.png" if classification else None, moments=opt.estimator == "vdp")
    write_json(out / "metrics.json", {"test": metrics, "history": history.epochs, "config": cfg.to_dict()})
    console.print(metrics_table(f"test metrics ({cfg.output.num_samples} samples)", {cfg.guide.name: metrics}))
    say(f"wrote {out}/checkpoint.pt, metrics.json" + (", reliability.png" if classification else ""))
    return metrics
