"""Names to objects: the prior, likelihood, β schedule, optimiser, network, model and guide a run names, and
the checks of a run's options that need them (before anything is loaded or written)."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
from pathlib import Path
from typing import Optional

import torch

from pyrobnn.checkpoint import load_checkpoint
from pyrobnn.checks import in_range, multiples_near, nonnegative, nonnegative_int, one_line, positive, positive_int
from pyrobnn.cli.methods import GUIDE_ARGUMENTS, SCHEDULE_ARGUMENTS, resolve_method, run_method
from pyrobnn.cli.noise import check_noise, noise_options
from pyrobnn.cli.options import (
    MCMC_MODELS,
    PROTOCOL,
    TAU,
    TOY_DATASETS,
    LikelihoodOptions,
    MCMCConfig,
    MCMCLikelihoodOptions,
    RunConfig,
    api_value,
    flag,
    grid_entry,
    mcmc_dataset,
    noise_precision,
    site_rates,
)
from pyrobnn.data import TEXT_DATASETS, Columns, canonical_name, check_dataset, uci_protocol
from pyrobnn.data.splits import DEFAULT_FOLDS, holdout_size
from pyrobnn.data.tables import table_source
from pyrobnn.guides import GUIDES
from pyrobnn.handlers import ESTIMATORS
from pyrobnn.handlers.node_draws import check_components
from pyrobnn.infer.mcmc import MAX_FULL_BATCH, check_prior
from pyrobnn.infer.optim import FlatThenLinear, GuideRateOptim, Optim, StepDecay
from pyrobnn.infer.schedules import SCHEDULES, Constant
from pyrobnn.infer.sgmcmc import SGMCMC
from pyrobnn.infer.swag import check_collection
from pyrobnn.methods import Method
from pyrobnn.methods.rules import learning_rate
from pyrobnn.model import BayesianNetwork
from pyrobnn.model.conversion import last_layer
from pyrobnn.model.likelihoods import LIKELIHOODS, HeteroscedasticGaussian
from pyrobnn.model.priors import PRIORS
from pyrobnn.networks import build_net

__all__ = ["make_prior", "make_likelihood", "beta_schedule", "optimizer_of", "settings_of", "method_of", "build",
           "build_network", "network_of", "load_pretrained", "check_run", "check_batches", "check_posterior",
           "check_mcmc", "check_calibration", "noise_grid", "dataset_options", "check_data", "check_swag",
           "check_sgmcmc", "sampler"]


def _construct(kind: str, registry: dict, name: str, options, *args, renamed: Optional[dict] = None):
    """``registry[name](*args, **kw)`` with ``kw`` the fields of ``options`` the constructor takes
    (through ``renamed``: constructor argument -> field). A field that the constructor does not take
    but was changed from its default is an error, not silently ignored."""
    cls, kwargs = _arguments(kind, registry, name, options, renamed)
    return cls(*args, **kwargs)


def _arguments(kind: str, registry: dict, name: str, options, renamed: Optional[dict] = None) -> tuple[type, dict]:
    """``(registry[name], kw)`` of :func:`_construct`."""
    cls = registry[name]
    parameters = inspect.signature(cls).parameters
    renamed = renamed or {}
    taken = {renamed.get(p, p): p for p in parameters}
    kwargs, ignored = {}, []
    for f in dataclasses.fields(options):
        if f.name == "name":
            continue
        value = getattr(options, f.name)
        if f.name in taken:
            if value is not None:  # None: the constructor's own default
                kwargs[taken[f.name]] = api_value(value)
        elif value != f.default:
            ignored.append(flag(kind, f.name, True))
    if ignored:
        raise ValueError(f"{' and '.join(ignored)} {'does' if len(ignored) == 1 else 'do'} not apply to "
                         f"--{kind} {name}")
    return cls, kwargs


def make_prior(cfg):
    """The prior named by ``--prior``, with its options."""
    return _construct("prior", PRIORS, cfg.prior.name, cfg.prior)


def make_likelihood(cfg, task: Optional[str], method: Optional[Method] = None):
    """The likelihood named by ``--likelihood`` (``auto``: by ``task``), checked against the task
    (``None``: not checked); a Gaussian's unset noise is :func:`~pyrobnn.cli.noise.noise_options`' for ``method``
    (default the run's, :func:`method_of`)."""
    name = cfg.likelihood.name
    if name == "auto":
        name = "categorical" if task == "classification" else "gaussian"
    if task is not None and (name == "categorical") != (task == "classification"):
        raise ValueError(f"--likelihood {name} needs a {'classification' if name == 'categorical' else 'regression'} "
                         f"dataset; {cfg.data.dataset} is {task}")
    options = cfg.likelihood
    if name == "gaussian" and options.scale is None:
        options = noise_options(options, method_of(cfg) if method is None else method)
    return _construct("likelihood", LIKELIHOODS, name, options)


def _schedule(cfg: RunConfig):
    """The β schedule that ``--beta`` names, with its options; ``None`` for ``--beta auto`` (the paper's: the
    method's rule, :func:`~pyrobnn.methods.rules.paper_schedule`), which takes no options."""
    options = cfg.optim.beta
    if options.name == "auto":
        changed = [flag("beta", f.name, True) for f in dataclasses.fields(options)
                   if f.name != "name" and getattr(options, f.name) != f.default]
        if changed:
            raise ValueError(f"{' and '.join(changed)} need(s) a named schedule: --beta constant, linear or geometric "
                             "(--beta auto picks the paper's schedule and its options)")
        return None
    return _construct("beta", SCHEDULES, options.name, options, renamed=SCHEDULE_ARGUMENTS)


def beta_schedule(cfg: RunConfig):
    """The run's β schedule: ``--beta`` with its options, or for ``--beta auto`` the method's paper's
    (:meth:`~pyrobnn.methods.Method.schedule`)."""
    return method_of(cfg).schedule(cfg.optim.epochs)


def settings_of(cfg: RunConfig) -> dict:
    """The settings of :class:`~pyrobnn.methods.Method` that the options build: the prior, the guide factory, the
    estimator, particles, batch size, predictive samples, β schedule (``None``: auto) and optimiser."""
    guide_cls, guide_kwargs = _arguments("guide", GUIDES, cfg.guide.name, _guide_options(cfg), GUIDE_ARGUMENTS)
    opt = cfg.optim
    return dict(prior=make_prior(cfg), guide=functools.partial(guide_cls, **guide_kwargs), estimator=opt.estimator,
                num_particles=opt.num_particles, batch_size=opt.batch_size, num_samples=cfg.output.num_samples,
                beta=_schedule(cfg), optimizer=optimizer_of(cfg))


def method_of(cfg: RunConfig) -> Method:
    """The method the run trains (:func:`~pyrobnn.cli.methods.run_method` of :func:`settings_of`)."""
    return run_method(cfg, settings_of(cfg))


def _selection(cfg, net):

    if cfg.model.bayesian == "all":
        return None
    if cfg.model.bayesian == "last-layer":
        return last_layer(net)
    return [pattern.strip() for pattern in cfg.model.bayesian.split(",") if pattern.strip()]


def build(cfg: RunConfig, data, method: Optional[Method] = None) -> tuple[BayesianNetwork, object]:
    """The model and guide of a run, for a dataset (:class:`~pyrobnn.data.DataSplits`): the network with the method's
    prior and guide (:meth:`~pyrobnn.methods.Method.build`; ``method``: the run's, :func:`method_of`).

    Weights are initialised from torch's global RNG: seed it first (``pyro.set_rng_seed``)
    for a reproducible initialisation.
    """
    method = method_of(cfg) if method is None else method
    net, likelihood = network_of(cfg, data, method)
    return method.build(net, likelihood=likelihood, num_data=len(data.x_train), **_selected_sites(cfg, net, data))


def _guide_options(cfg):
    """``cfg.guide``, with ``--guide.rates`` folded into the dropout guide's ``rate`` mapping (:func:`site_rates`)."""
    options = cfg.guide
    if options.rates and options.name != "dropout":
        raise ValueError(f"--guide.rates does not apply to --guide {options.name}: it sets the rates of --guide "
                         "dropout")
    if options.rates:
        options = dataclasses.replace(options, rate=site_rates(options.rates, options.rate), rates=())
    return options


def build_network(cfg, data) -> BayesianNetwork:
    """The model of a run (:class:`RunConfig` or :class:`MCMCConfig`: its data, model, prior and likelihood
    groups), for a dataset (:class:`~pyrobnn.data.DataSplits`); weights drawn from torch's global RNG."""
    net, likelihood = network_of(cfg, data)
    return BayesianNetwork(net, likelihood, prior=make_prior(cfg), num_data=len(data.x_train),
                           **_selected_sites(cfg, net, data))


def _selected_sites(cfg, net, data) -> dict:
    """Which of ``net``'s parameters are Bayesian (``--bayesian``), and the inputs' shape."""
    return dict(include=_selection(cfg, net), deterministic=cfg.model.bayesian == "none",
                input_shape=data.input_shape)


def network_of(cfg, data, method: Optional[Method] = None) -> tuple:
    """``(network, likelihood)`` of a run for a dataset: the likelihood of ``--likelihood`` (checked against the
    task) and the network of ``--model`` with as many outputs as it needs (``--init-from``: its pre-trained
    weights); weights drawn from torch's global RNG."""
    likelihood = make_likelihood(cfg, data.task, method)
    outputs = data.num_outputs * (2 if isinstance(likelihood, HeteroscedasticGaussian) else 1)
    try:
        net = build_net(cfg.model.name, data.input_shape, outputs, hidden=cfg.model.hidden, dropout=cfg.model.dropout,
                        width=cfg.model.width, vocab_size=getattr(data, "vocab_size", None), lora=lora_of(cfg))
    except ValueError as error:
        raise ValueError(f"--model {cfg.model.name}: {error}") from None
    if cfg.model.init_from is not None:
        load_pretrained(net, cfg.model.init_from)
    return net, likelihood


def lora_of(cfg):
    """The LoRA adapters of a pretrained network (``--lora-rank``, ``--lora-alpha``, ``--lora-targets``), None for
    another network; a ``ValueError`` naming the option set for a network without them."""
    model = cfg.model
    from pyrobnn.networks.hf import LoRA

    default = LoRA()
    given = {"--lora-rank": (model.lora_rank, default.r), "--lora-alpha": (model.lora_alpha, default.alpha),
             "--lora-targets": (tuple(model.lora_targets), default.targets)}
    if not model.name.lower().startswith("hf:"):
        changed = [flag for flag, (value, base) in given.items() if value != base]
        if changed:
            raise ValueError(f"{changed[0]} sets the LoRA adapters of a pretrained network (--model hf:NAME), not of "
                             f"--model {model.name}")
        return None
    try:
        return LoRA(r=model.lora_rank, alpha=model.lora_alpha, targets=tuple(model.lora_targets))
    except ValueError as error:
        raise ValueError(f"--lora-rank/--lora-alpha/--lora-targets: {error}") from None


def check_pretrained(cfg) -> None:
    """A pretrained network's source before anything is written: the ``hf:`` name or folder (its weights there,
    their hash), the LoRA options (:func:`lora_of`), and a text dataset for it. Raises ``ValueError``
    (``ImportError`` naming the extra) naming the option."""
    lora = lora_of(cfg)
    name = cfg.model.name
    if not name.lower().startswith("hf:"):
        return
    from pyrobnn.networks.hf import check_lora

    try:
        check_lora(name[3:], lora)
    except ValueError as error:
        raise ValueError(f"--model {name}: {error}") from None
    if canonical_name(cfg.data.dataset) not in TEXT_DATASETS:
        raise ValueError(f"--model {name} reads text: use a text dataset ({', '.join(TEXT_DATASETS)}), got "
                         f"--dataset {cfg.data.dataset}")


def load_pretrained(net: torch.nn.Module, path) -> None:
    """Load into ``net`` the network of a deterministic run's checkpoint (``--init-from``: every parameter a point,
    stored as ``net.<name>`` in its model's state)."""
    weights = {name[len("net."):]: value for name, value in load_checkpoint(path)["model"].items()
               if name.startswith("net.")}
    try:
        net.load_state_dict(weights)
    except RuntimeError as error:
        raise ValueError(f"--init-from {path}: its network does not fit this one (pre-train with --bayesian none and "
                         f"the same --model, --hidden and --width): {one_line(error)[:300]}") from None


def dataset_options(cfg) -> dict:
    """The arguments of :func:`~pyrobnn.data.load_dataset` (and :func:`~pyrobnn.data.check_dataset`) that the data
    options set besides the sizes: the split (``--split``, ``--data.folds``, ``--data.test-fraction``,
    ``--data.seed``) and what a table's columns are (``--data.target``, ``--data.task``, ``--data.features``,
    ``--data.categorical``)."""
    data = cfg.data
    columns = Columns(data.target, data.task, tuple(data.features) or None, tuple(data.categorical))
    return dict(split=data.split, folds=data.folds, test_fraction=data.test_fraction, split_seed=data.split_seed,
                columns=None if columns.is_default() else columns)


def check_data(cfg) -> None:
    """The data options, then the dataset with them (:func:`~pyrobnn.data.check_dataset`: a table is read and
    split, so a missing file or column, a bad cell, a target of one value or a class with no training row is found
    before anything runs). Raises :class:`ValueError` (:class:`FileNotFoundError`) naming the option or the file."""
    data = cfg.data
    if data.folds is not None and positive_int("--data.folds", data.folds) < 2:
        raise ValueError(f"--data.folds must be at least 2 (one fold tested, the others trained on), got {data.folds}")
    if data.test_fraction is not None:
        in_range("--data.test-fraction", data.test_fraction, 0, 1, "()")
    if data.split_seed is not None:
        nonnegative_int("--data.seed", data.split_seed)
    if getattr(data, "max_length", None) is not None:
        positive_int("--data.max-length", data.max_length)
        if canonical_name(data.dataset) not in TEXT_DATASETS:
            raise ValueError(f"--data.max-length applies to text datasets ({', '.join(TEXT_DATASETS)}), not to "
                             f"--dataset {data.dataset}")
    splits_rows = table_source(data.dataset) is not None or data.dataset.startswith("folder:")
    if data.split is not None:
        nonnegative_int("--split", data.split)
        folds = DEFAULT_FOLDS if data.folds is None else data.folds
        if splits_rows and data.split >= folds:
            raise ValueError(f"--split {data.split} is out of range: --data.folds {folds} makes splits 0 to "
                             f"{folds - 1}; pass a split in 0..{folds - 1}, or --data.folds {data.split + 1} or more")
        if data.test_fraction is not None:
            raise ValueError(f"--split {data.split} and --data.test-fraction {data.test_fraction} choose the test rows "
                             "two ways (a fold, a random share): pass one")
    elif data.folds is not None and splits_rows:
        raise ValueError(f"--data.folds {data.folds} needs --split i, the fold to test on (pyrobnn study --splits "
                         f"{data.folds} runs them all)")
    check_dataset(data.dataset, data.data_root, **dataset_options(cfg))


def check_run(cfg: RunConfig) -> None:
    """Validate the options before anything is loaded or written: counts, the prior, likelihood and schedule
    options, and the data (:func:`check_data`; registered dataset names are checked, a table is read; model names
    are checked by :func:`~pyrobnn.networks.build_net`, which knows their aliases).

    Raises :class:`ValueError` naming the option.
    """
    for option, value in (("--epochs", cfg.optim.epochs), ("--batch-size", cfg.optim.batch_size),
                          ("--num-particles", cfg.optim.num_particles), ("--num-samples", cfg.output.num_samples)):
        positive_int(option, value)
    for option, value in (("--train-size", cfg.data.train_size), ("--test-size", cfg.data.test_size)):
        if value is not None:
            positive_int(option, value)
    nonnegative_int("--val-size", cfg.data.val_size)
    nonnegative_int("--lr-step", cfg.optim.lr_step)
    in_range("--lr-linear-from (the fraction of the epochs after which the rate falls to 0)", cfg.optim.lr_linear_from,
             0, 1)
    if cfg.optim.lr_step and cfg.optim.lr_linear_from:
        raise ValueError("--lr-step and --lr-linear-from are two learning-rate schedules: pass one of them")
    if cfg.model.init_from is not None and not Path(cfg.model.init_from).is_file():
        raise ValueError(f"--init-from {cfg.model.init_from}: no such file; give the checkpoint.pt of a `pyrobnn train "
                         "--bayesian none` run")
    make_prior(cfg)
    _guide_options(cfg)
    _schedule(cfg)
    if cfg.likelihood.name != "auto":
        make_likelihood(cfg, None)
    if cfg.optim.estimator == "vdp" and cfg.optim.num_particles != 1:
        raise ValueError(f"--num-particles {cfg.optim.num_particles} does not apply to --estimator vdp: VDP++ "
                         "propagates moments deterministically, one pass without particles")
    if cfg.output.max_memory is not None:
        positive("--max-memory (GB)", cfg.output.max_memory)
    if cfg.guide.name == "mixture-node":  # the test report draws the same number from each component
        k, n = positive_int("--guide.components", cfg.guide.components), cfg.output.num_samples
        if n % k:
            raise ValueError(f"--num-samples {n} must be a multiple of --guide.components {k} (the mixture guide's "
                             f"predictions draw as many samples from each component): pass {multiples_near(n, k)}")
    check_posterior(cfg)
    check_noise(cfg, method_of(cfg))  # the method the options describe: its prior, guide, schedule, optimiser
    check_calibration(cfg)
    check_data(cfg)
    check_pretrained(cfg)


def check_batches(cfg: RunConfig, num_examples: int) -> None:
    """Before any training: the batches of a mixture-node guide split evenly among its components on the
    ``num_examples`` training rows, and with ``--grid`` on the 80 % that its points train on
    (:func:`~pyrobnn.handlers.node_draws.check_components`), and ``--sgmcmc`` keeps draws in epochs of that many rows
    (:func:`sampler`); a :class:`ValueError` naming the options otherwise."""
    sizes = [num_examples] + ([holdout_size(num_examples)] if cfg.optim.grid else [])
    if cfg.posterior.sgmcmc != "none":  # the draws kept on that many rows
        for n in sizes:
            sampler(cfg, math.ceil(n / cfg.optim.batch_size))
    if cfg.guide.name != "mixture-node" or not ESTIMATORS[cfg.optim.estimator].stochastic:
        return
    for n in sizes:
        try:
            check_components(cfg.guide.components, cfg.optim.batch_size, cfg.optim.num_particles, n)
        except ValueError as error:
            where = "the --grid points' " if n != num_examples else ""
            raise ValueError(f"--guide.components {cfg.guide.components}, --batch-size {cfg.optim.batch_size}, "
                             f"--num-particles {cfg.optim.num_particles} on {where}{n} training examples: {error}"
                             ) from None


def check_posterior(cfg: RunConfig) -> None:
    """``--method`` names a method that ``pyrobnn train`` runs; ``--ensemble``, ``--laplace``, ``--swag`` and
    ``--sgmcmc`` start from MAP fits (``--guide point``), one at a time but for MultiSWAG (``--ensemble M --swag``),
    with their own options only beside them (:func:`check_swag`, :func:`check_sgmcmc`)."""
    if cfg.method is not None:
        method = resolve_method(cfg.method)
        if method.command != "train":
            raise ValueError(f"--method {cfg.method} runs with `pyrobnn {method.command}`, not `pyrobnn train`: "
                             f"pyrobnn {method.command} --method {cfg.method} --dataset two-moons ...")
    post = cfg.posterior
    ensemble = nonnegative_int("--ensemble", post.ensemble)
    named = [flag for flag, on in ((f"--ensemble {ensemble}", ensemble and not post.swag), ("--laplace", post.laplace),
                                   ("--swag", post.swag), (f"--sgmcmc {post.sgmcmc}", post.sgmcmc != "none")) if on]
    if len(named) > 1:
        raise ValueError(f"{named[0]} and {named[1]} are two posteriors: choose one"
                         + (" (several chains: --sgmcmc.chains C)" if ensemble and post.sgmcmc != "none" else ""))
    if named and cfg.guide.name != "point":
        raise ValueError(f"{named[0]} starts from MAP fits: use --guide point (got --guide {cfg.guide.name})")
    check_swag(cfg)
    check_sgmcmc(cfg)


def _options_beside(cfg: RunConfig, prefix: str, used: bool, what: str) -> None:
    """Options ``--<prefix>.*`` changed from their default without the posterior they set: a ``ValueError``."""
    if used:
        return
    defaults = RunConfig().flags()
    changed = [name for name, value in cfg.flags().items()
               if name.startswith(f"--{prefix}.") and value != defaults[name]]
    if changed:
        raise ValueError(f"{changed[0]} sets {what}: add --{prefix}{'' if prefix == 'swag' else ' NAME'}")


def check_swag(cfg: RunConfig) -> None:
    """``--swag``: SGD's iterates (``--optimizer sgd``), a rank of at least 2, a start that leaves two epochs to
    collect, a positive ``--swag.lr`` that is the only learning-rate schedule."""
    post = cfg.posterior
    _options_beside(cfg, "swag", post.swag, "SWAG's collection")
    if not post.swag:
        return
    if cfg.optim.optimizer != "sgd":
        raise ValueError(f"--swag fits its Gaussian to SGD's iterates: pass --optimizer sgd (got --optimizer "
                         f"{cfg.optim.optimizer})")
    if post.swag_lr is not None:
        positive("--swag.lr", post.swag_lr)
        if cfg.optim.lr_step or cfg.optim.lr_linear_from:
            raise ValueError("--swag.lr sets SWAG's learning-rate schedule: drop --lr-step and --lr-linear-from")
        lr = optimizer_of(cfg).lr
        if post.swag_lr > lr:
            raise ValueError(f"--lr {lr:g} is below SWAG's SWA rate --swag.lr {post.swag_lr:g}, and SWAG's rate "
                             f"falls from --lr to it (Maddox et al. 2019): pass --swag.lr {lr:g} or lower (a study: "
                             "--swag.lr in its base, or --vary swag.lr=...), or a higher --lr")
    check_collection(method_of(cfg).collection_start(cfg.optim.epochs), cfg.optim.epochs, post.swag_rank,
                     {"start": "--swag.start", "rank": "--swag.rank", "epochs": "--epochs"})


def check_sgmcmc(cfg: RunConfig) -> None:
    """``--sgmcmc``: the sampler's options, β = 1, no other learning-rate schedule, weight decay or particles, and
    several chains only without ``--augment`` and ``--val-size`` (they run as one stacked network)."""
    post = cfg.posterior
    _options_beside(cfg, "sgmcmc", post.sgmcmc != "none", "the SG-MCMC sampler")
    if post.sgmcmc == "none":
        return
    positive_int("--sgmcmc.chains", post.sgmcmc_chains)
    sampler(cfg, steps_per_epoch=LONG_EPOCH)  # the draws of the run's own epochs: check_batches
    for option, value, default in (("--weight-decay", cfg.optim.weight_decay, 0.0),
                                   ("--lr-step", cfg.optim.lr_step, 0),
                                   ("--lr-linear-from", cfg.optim.lr_linear_from, 0.0),
                                   ("--variational-lr-factor", cfg.optim.variational_lr_factor, 1.0),
                                   ("--num-particles", cfg.optim.num_particles, 1)):
        if value != default:
            raise ValueError(f"{option} {value} does not apply to --sgmcmc: the sampler's step follows the posterior "
                             "(the prior is the weight decay; the step-size schedule is --sgmcmc.cycles)")
    if beta_schedule(cfg) != Constant(1.0):
        raise ValueError(f"--sgmcmc samples the posterior, whose KL weight is 1: drop --beta {cfg.optim.beta.name} "
                         "(a tempered posterior is --sgmcmc.temperature)")
    if post.sgmcmc_chains > 1 and (cfg.data.augment or cfg.data.val_size):
        raise ValueError(f"--sgmcmc.chains {post.sgmcmc_chains} run as one stacked network, which takes no "
                         f"{'--augment' if cfg.data.augment else '--val-size'}: run one chain")


LONG_EPOCH = 10**6
"""Steps of an epoch with which the sampler's settings are checked before the data's size is known (the draws that
the run's own epochs keep: :func:`check_batches`)."""


def sampler(cfg: RunConfig, steps_per_epoch: int) -> SGMCMC:
    """The optimizer factory of ``--sgmcmc`` for epochs of ``steps_per_epoch`` steps, checked (a ``ValueError`` naming
    ``--sgmcmc``)."""
    method = method_of(cfg)
    try:
        return SGMCMC(method.learning_rate, epochs=cfg.optim.epochs, steps_per_epoch=steps_per_epoch,
                      **method.settings())
    except ValueError as error:
        raise ValueError(f"--sgmcmc {cfg.posterior.sgmcmc}: {error}") from None


def check_calibration(cfg) -> None:
    """``--calibrate.fraction`` and ``--calibrate.coverage`` lie in (0, 1) (whether or not ``--calibrate`` is on)."""
    in_range("--calibrate.fraction (the share of the training rows held out)", cfg.calibration.fraction, 0, 1, "()")
    in_range("--calibrate.coverage (of the conformal sets)", cfg.calibration.coverage, 0, 1, "()")


def check_mcmc(cfg: MCMCConfig) -> None:
    """Validate everything that needs no data: the NUTS options, a toy or UCI dataset and its sizes, a small
    mlp without dropout, a prior with a density, and no option that has no meaning for NUTS.

    Raises :class:`ValueError` naming the option. Run before anything is loaded or written.
    """
    mc = cfg.mcmc
    check_calibration(cfg)
    for option, value in (("--num-samples", mc.num_samples), ("--num-chains", mc.num_chains),
                          ("--max-tree-depth", mc.max_tree_depth)):
        positive_int(option, value)
    nonnegative_int("--warmup", mc.warmup)
    in_range("--target-accept", mc.target_accept, 0, 1, "()")
    nonnegative("--init-jitter", mc.init_jitter)
    positive_int("--grid-samples", mc.grid_samples)
    dataset = mcmc_dataset(cfg.data.dataset)
    if cfg.data.split is not None:
        if dataset in TOY_DATASETS:
            raise ValueError(f"--split applies to the UCI data sets (uci-NAME, uci:PATH); {cfg.data.dataset} is a "
                             "generated toy problem: drop --split")
        nonnegative_int("--split", cfg.data.split)
    if mc.grid:
        noise_grid(cfg, read_protocol=False)
    for option, value in (("--train-size", cfg.data.train_size), ("--test-size", cfg.data.test_size)):
        if value is not None:
            positive_int(option, value)
    if cfg.data.train_size is not None and cfg.data.train_size > MAX_FULL_BATCH:
        raise ValueError(f"--train-size {cfg.data.train_size}: NUTS runs full batch and pyrobnn mcmc takes at "
                         f"most {MAX_FULL_BATCH} training points")
    if cfg.data.val_size != 0:
        raise ValueError("--val-size does not apply to pyrobnn mcmc: it samples on every training point and "
                         "reports no validation metrics")
    if cfg.model.name.lower() not in MCMC_MODELS:
        raise ValueError(f"--model {cfg.model.name}: pyrobnn mcmc samples small networks, --model "
                         f"{' or '.join(MCMC_MODELS)} with a few narrow --hidden layers")
    for width in cfg.model.hidden:
        positive_int("--hidden", width)
    if cfg.model.dropout != 0:
        raise ValueError("--dropout does not apply to pyrobnn mcmc: NUTS needs a potential energy that is a "
                         "deterministic function of the weights")
    if cfg.model.bayesian == "none":
        raise ValueError("--bayesian none leaves no weights for NUTS to sample")
    if cfg.prior.name == "node":
        raise ValueError("--prior node does not apply to pyrobnn mcmc: the implicit BNN keeps its weights as point "
                         "estimates to be trained, so NUTS would sample the node latents of an untrained network; "
                         "use --prior gaussian or scale-mixture (or train the implicit BNN with `pyrobnn train`)")
    reference = torch.full((2,), 0.5)
    try:
        check_prior(make_prior(cfg)(reference), reference, "its distribution")
    except ValueError as error:
        raise ValueError(f"--prior {cfg.prior.name} has no proper density for NUTS: {error}") from None
    defaults = LikelihoodOptions()
    for name in ("learn_scale", "vdp_objective"):
        if getattr(cfg.likelihood, name) != getattr(defaults, name):
            raise ValueError(f"{flag('likelihood', name, True)} does not apply to pyrobnn mcmc: NUTS samples "
                             "the weights and holds the likelihood fixed")
    if cfg.likelihood.name != "auto":
        make_likelihood(cfg, None)


def optimizer_of(cfg: RunConfig) -> Optim:
    """The optimiser of ``--optimizer``, ``--lr`` (by default the prior's: :func:`~pyrobnn.methods.rules.learning_rate`)
    and ``--weight-decay`` (per example, as papers state them), with the step decay of ``--lr-step`` and
    ``--lr-gamma`` or the linear decay of ``--lr-linear-from``, and ``--variational-lr-factor`` times the rate on the
    guide's parameters (:class:`~pyrobnn.infer.optim.GuideRateOptim`). A method may build on it (SWAG's schedule down
    to ``--swag.lr``; SG-MCMC's sampler replaces it)."""
    opt = cfg.optim
    schedule = StepDecay(opt.lr_step, opt.lr_gamma) if opt.lr_step else \
        FlatThenLinear(opt.epochs, start=opt.lr_linear_from, end=1.0, final=0.0) if opt.lr_linear_from else None
    lr = opt.lr if opt.lr is not None else learning_rate(make_prior(cfg))
    if opt.variational_lr_factor != 1:
        return GuideRateOptim(opt.optimizer, lr, opt.weight_decay, schedule=schedule,
                              factor=positive("--variational-lr-factor", opt.variational_lr_factor))
    return Optim(opt.optimizer, lr, opt.weight_decay, schedule=schedule)


def noise_grid(cfg: MCMCConfig, read_protocol: bool = True) -> tuple[str, ...]:
    """The noise precisions :math:`\\tau` of ``--grid`` (as written; ``protocol``: the data set's
    ``tau_values.txt``, read only with ``read_protocol``); empty without ``--grid``. A malformed entry, another name
    than ``tau``, a value that is not a positive number, a repeated value, or ``--likelihood.scale`` beside
    ``--grid`` is a :class:`ValueError` naming ``--grid``."""
    values: list[str] = []
    for spec in cfg.mcmc.grid:
        if spec.strip() == PROTOCOL:
            if read_protocol:
                values += [repr(tau) for tau in uci_protocol(cfg.data.dataset, cfg.data.data_root).tau_values]
            continue
        entry = grid_entry(spec)
        if entry is None or entry[0] != TAU:
            raise ValueError(f"--grid {spec!r}: pyrobnn mcmc chooses only the noise precision; write "
                             f"{TAU}=V1,V2,... (in the target's original units) or {PROTOCOL}")
        for text in entry[1]:
            noise_precision(text)
        values += entry[1]
    repeated = sorted({value for value in values if values.count(value) > 1})
    if repeated:
        raise ValueError(f"--grid names {TAU}={', '.join(repeated)} more than once")
    if cfg.mcmc.grid and cfg.likelihood.scale != MCMCLikelihoodOptions().scale:
        raise ValueError(f"--likelihood.scale {cfg.likelihood.scale} and --grid both set the noise: drop one")
    if read_protocol and cfg.mcmc.grid and not values:
        raise ValueError(f"--grid {PROTOCOL}: {cfg.data.dataset} has no noise precisions (tau_values.txt)")
    return tuple(values)
