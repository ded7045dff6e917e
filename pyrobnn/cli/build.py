"""Names to objects: the prior, likelihood, β schedule, optimiser, network, model and guide a run names, the run
parsed once (:class:`Run`: its options and the method built from them), and the checks of a run's options that need
them (before anything is loaded or written). What a method requires is the method's (:mod:`pyrobnn.methods`): the
checks here report it in the command's options (:func:`~pyrobnn.cli.methods.spelled`)."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from pyrobnn.checkpoint import load_checkpoint
from pyrobnn.checks import in_range, nonnegative_int, one_line, positive, positive_int
from pyrobnn.cli.methods import GUIDE_ARGUMENTS, SCHEDULE_ARGUMENTS, run_method, spelled
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
)
from pyrobnn.data import TEXT_DATASETS, Columns, canonical_name, check_dataset, uci_protocol
from pyrobnn.data.splits import DEFAULT_FOLDS, holdout_size
from pyrobnn.data.tables import table_source
from pyrobnn.guides import GUIDES
from pyrobnn.infer.optim import FlatThenLinear, GuideRateOptim, Optim, StepDecay
from pyrobnn.infer.schedules import SCHEDULES
from pyrobnn.methods import METHODS, Method, Refused
from pyrobnn.methods.rules import learning_rate, regression_noise
from pyrobnn.model import BayesianNetwork
from pyrobnn.model.conversion import last_layer
from pyrobnn.model.likelihoods import LIKELIHOODS, HeteroscedasticGaussian
from pyrobnn.model.priors import PRIORS
from pyrobnn.networks import NetworkSpec, network_spec
from pyrobnn.networks.hf import LoRA

__all__ = ["Run", "make_prior", "make_likelihood", "beta_schedule", "optimizer_of", "settings_of", "method_of",
           "build", "build_network", "network_of", "load_pretrained", "check_run", "check_batches", "check_mcmc",
           "check_calibration", "noise_grid", "dataset_options", "check_data", "nuts_of"]


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
    """The likelihood named by ``--likelihood`` (``auto``: by ``task``), checked against the task (``None``: not
    checked); a Gaussian's noise follows ``method``'s rule where the options leave it unset
    (:func:`~pyrobnn.methods.rules.regression_noise`; ``method`` None: a plain variational fit's)."""
    name = cfg.likelihood.name
    if name == "auto":
        name = "categorical" if task == "classification" else "gaussian"
    if task is not None and (name == "categorical") != (task == "classification"):
        raise ValueError(f"--likelihood {name} needs a {'classification' if name == 'categorical' else 'regression'} "
                         f"dataset; {cfg.data.dataset} is {task}")
    if name != "gaussian":
        return _construct("likelihood", LIKELIHOODS, name, cfg.likelihood)
    _construct("likelihood", LIKELIHOODS, name, dataclasses.replace(cfg.likelihood, scale=1.0))  # its options
    method = METHODS["map"] if method is None else method
    try:
        return regression_noise(method, cfg.likelihood.scale, cfg.likelihood.learn_scale)
    except Refused as refusal:
        raise ValueError(spelled(refusal)) from None
    except ValueError as error:
        raise ValueError(spelled(Refused(method, str(error)))) from None


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


@dataclass(frozen=True)
class Run:
    """A ``pyrobnn train`` run, parsed once: its options (:class:`~pyrobnn.cli.options.RunConfig`, what its
    checkpoint stores: the data and output specs among them), the method it trains, built from them once
    (:func:`method_of`), and the network it builds (:class:`~pyrobnn.networks.NetworkSpec`, resolved once:
    :func:`network_spec_of`). Everything the run does reads them here."""

    config: RunConfig
    method: Method
    network: NetworkSpec

    @classmethod
    def of(cls, cfg: RunConfig) -> "Run":
        """The run of ``cfg`` (a stored configuration: its options checked when it was trained), its method built
        and its network resolved once; a new run's options are checked by :func:`check_run`, which returns its run."""
        return cls(cfg, method_of(cfg), network_spec_of(cfg))

    def build(self, data) -> tuple:
        """The model and guide of the run for ``data`` (:func:`build`), weights drawn from torch's global RNG."""
        return build(self.config, data, self.method, self.network)

    def check_rows(self, rows: int) -> None:
        """The method's rules on the run's training rows (a mixture's batches, SG-MCMC's draws; with ``--grid`` on
        the 80 % its points train on too), before any training: a ``ValueError`` naming the options."""
        cfg = self.config
        for n in [rows] + ([holdout_size(rows)] if cfg.optim.grid else []):
            try:
                self.method.check(epochs=cfg.optim.epochs, rows=n)
            except Refused as refusal:
                where = f"the --grid points' {n} training examples: " if n != rows else ""
                raise ValueError(where + spelled(refusal)) from None


def settings_of(cfg: RunConfig) -> dict:
    """The settings of :class:`~pyrobnn.methods.Method` that the options build: the prior, the guide factory, the
    estimator, particles, batch size, predictive samples, β schedule (``None``: auto) and optimiser."""
    guide_cls, guide_kwargs = _arguments("guide", GUIDES, cfg.guide.name, _guide_options(cfg), GUIDE_ARGUMENTS)
    opt = cfg.optim
    samples = {} if cfg.output.num_samples is None else {"num_samples": cfg.output.num_samples}  # unset: the method's
    return dict(prior=make_prior(cfg), guide=functools.partial(guide_cls, **guide_kwargs), estimator=opt.estimator,
                num_particles=opt.num_particles, batch_size=opt.batch_size, **samples, beta=_schedule(cfg),
                optimizer=optimizer_of(cfg))


def method_of(cfg: RunConfig) -> Method:
    """The method the run trains (:func:`~pyrobnn.cli.methods.run_method` of :func:`settings_of`), built: a run
    builds it once (:class:`Run`, :func:`check_run`)."""
    return run_method(cfg, settings_of(cfg))


def _selection(cfg, net):

    if cfg.model.bayesian == "all":
        return None
    if cfg.model.bayesian == "last-layer":
        return last_layer(net)
    return [pattern.strip() for pattern in cfg.model.bayesian.split(",") if pattern.strip()]


def build(cfg: RunConfig, data, method: Optional[Method] = None,
          network: Optional[NetworkSpec] = None) -> tuple[BayesianNetwork, object]:
    """The model and guide of a run, for a dataset (:class:`~pyrobnn.data.DataSplits`): the network with the method's
    prior and guide (:meth:`~pyrobnn.methods.Method.build`; ``method``: the run's, :func:`method_of`).

    Weights are initialised from torch's global RNG: seed it first (``pyro.set_rng_seed``)
    for a reproducible initialisation.
    """
    method = method_of(cfg) if method is None else method  # a run passes its own (Run.build)
    net, likelihood = network_of(cfg, data, method, network)
    return method.build(net, likelihood=likelihood, num_data=len(data.x_train), **_selected_sites(cfg, net, data))


def site_rates(entries: tuple[str, ...], rate: float) -> dict[str, float]:
    """``--guide.rates GLOB=RATE ...`` with ``--guide.rate`` as :class:`~pyrobnn.DropoutGuide`'s mapping from glob
    patterns over site names to dropout rates: the entries in order (first match wins), then ``"*"`` at ``rate``
    for every other site; a :class:`ValueError` naming ``--guide.rates`` for an entry that is not GLOB=RATE."""
    rates = {}
    for entry in entries:
        pattern, sep, text = entry.partition("=")
        try:
            value = float(text)
        except ValueError:
            value = None
        if not sep or not pattern.strip() or value is None:
            raise ValueError(f"--guide.rates {entry!r}: write GLOB=RATE over the model's site names, e.g. "
                             "'net.0.*=0' to keep a network's input undropped")
        rates[pattern.strip()] = value
    return {**rates, "*": rate} if "*" not in rates else rates


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


def network_of(cfg, data, method: Optional[Method] = None, network: Optional[NetworkSpec] = None) -> tuple:
    """``(network, likelihood)`` of a run for a dataset: the likelihood of ``--likelihood`` (checked against the
    task) and the network of ``--model`` (``network``: its spec, :func:`network_spec_of`) with as many outputs as it
    needs (``--init-from``: its pre-trained weights); weights drawn from torch's global RNG."""
    likelihood = make_likelihood(cfg, data.task, method)
    outputs = data.num_outputs * (2 if isinstance(likelihood, HeteroscedasticGaussian) else 1)
    network = network_spec_of(cfg) if network is None else network
    try:
        net = network.build(data.input_shape, outputs, hidden=cfg.model.hidden, dropout=cfg.model.dropout,
                            width=cfg.model.width, vocab_size=getattr(data, "vocab_size", None))
    except ValueError as error:
        raise ValueError(f"--model {cfg.model.name}: {error}") from None
    if cfg.model.init_from is not None:
        load_pretrained(net, cfg.model.init_from)
    return net, likelihood


def network_spec_of(cfg) -> NetworkSpec:
    """The network ``--model`` names (:func:`~pyrobnn.networks.network_spec`, the one place a name is parsed), with
    the LoRA adapters of ``--lora-rank``, ``--lora-alpha`` and ``--lora-targets`` for a source that takes them; a
    ``ValueError`` naming the option set for a network without them."""
    model = cfg.model
    try:
        network = network_spec(model.name)
    except ValueError as error:
        raise ValueError(f"--model {model.name}: {error}") from None
    given = {"--lora-rank": model.lora_rank, "--lora-alpha": model.lora_alpha,
             "--lora-targets": tuple(model.lora_targets)}
    if not network.source.takes_lora:
        changed = [flag for flag, value in given.items() if value != _LORA_DEFAULTS[flag]]
        if changed:
            raise ValueError(f"{changed[0]} sets the LoRA adapters of a pretrained network (--model hf:NAME), not of "
                             f"--model {model.name}")
        return network
    try:
        return dataclasses.replace(network, lora=LoRA(r=model.lora_rank, alpha=model.lora_alpha,
                                                      targets=tuple(model.lora_targets)))
    except ValueError as error:
        raise ValueError(f"--lora-rank/--lora-alpha/--lora-targets: {error}") from None


_LORA_DEFAULTS = {"--lora-rank": LoRA().r, "--lora-alpha": LoRA().alpha, "--lora-targets": LoRA().targets}


def lora_of(cfg):
    """The LoRA adapters of a pretrained network (``--lora-rank``, ``--lora-alpha``, ``--lora-targets``), None for
    another network (:func:`network_spec_of`)."""
    return network_spec_of(cfg).lora


def check_pretrained(cfg) -> None:
    """A pretrained network's source before anything is written: its name or folder (its weights there, their
    hash), the LoRA options (:meth:`~pyrobnn.networks.NetworkSpec.check`), and a text dataset for it. Raises
    ``ValueError`` (``ImportError`` naming the extra) naming the option."""
    network = network_spec_of(cfg)
    if not network.pretrained:
        return
    try:
        network.check()
    except ValueError as error:
        raise ValueError(f"--model {cfg.model.name}: {error}") from None
    if canonical_name(cfg.data.dataset) not in TEXT_DATASETS:
        raise ValueError(f"--model {cfg.model.name} reads text: use a text dataset ({', '.join(TEXT_DATASETS)}), got "
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


def check_run(cfg: RunConfig) -> Run:
    """Validate the options before anything is loaded or written and return the run, its method built once: counts,
    the prior, likelihood and schedule options, the method (what it refuses of its settings and of a run of
    ``--epochs``, :class:`~pyrobnn.methods.Refused`, named as options), the noise, and the data (:func:`check_data`;
    registered dataset names are checked, a table is read; model names are checked by
    :func:`~pyrobnn.networks.build_net`, which knows their aliases).

    Raises :class:`ValueError` naming the option.
    """
    for option, value in (("--epochs", cfg.optim.epochs), ("--batch-size", cfg.optim.batch_size),
                          ("--num-particles", cfg.optim.num_particles), ("--num-samples", cfg.output.num_samples)):
        if value is not None:
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
    if cfg.output.max_memory is not None:
        positive("--max-memory (GB)", cfg.output.max_memory)
    run = Run.of(cfg)
    try:
        run.method.check(epochs=cfg.optim.epochs, transform=True if cfg.data.augment else None,
                         validation=bool(cfg.data.val_size))
    except Refused as refusal:
        raise ValueError(spelled(refusal)) from None
    if cfg.likelihood.name != "auto":
        make_likelihood(cfg, None, run.method)
    if cfg.likelihood.learn_scale:  # a regression's noise the method cannot learn: refused before the data is read
        make_likelihood(dataclasses.replace(cfg, likelihood=dataclasses.replace(cfg.likelihood, name="gaussian")),
                        None, run.method)
    check_calibration(cfg)
    check_data(cfg)
    check_pretrained(cfg)
    return run


def check_batches(cfg: RunConfig, num_examples: int) -> None:
    """Before any training: the method's rules on the ``num_examples`` training rows (:meth:`Run.check_rows`)."""
    check_run(cfg).check_rows(num_examples)


def check_calibration(cfg) -> None:
    """``--calibrate.fraction`` and ``--calibrate.coverage`` lie in (0, 1) (whether or not ``--calibrate`` is on)."""
    in_range("--calibrate.fraction (the share of the training rows held out)", cfg.calibration.fraction, 0, 1, "()")
    in_range("--calibrate.coverage (of the conformal sets)", cfg.calibration.coverage, 0, 1, "()")


def nuts_of(cfg: MCMCConfig):
    """The NUTS a ``pyrobnn mcmc`` run samples with (:class:`~pyrobnn.methods.NUTS`): the ``--method nuts`` preset
    with the run's prior and NUTS options, built once; what it refuses is a ``ValueError`` naming the options."""
    mc = cfg.mcmc
    try:
        return dataclasses.replace(METHODS["nuts"], prior=make_prior(cfg), num_samples=mc.num_samples,
                                   warmup=mc.warmup, num_chains=mc.num_chains, target_accept=mc.target_accept,
                                   max_tree_depth=mc.max_tree_depth, init_jitter=mc.init_jitter,
                                   map_steps=mc.map_steps, sampler=api_value(mc.sampler))
    except Refused as refusal:
        raise ValueError(spelled(refusal, "mcmc")) from None


def check_mcmc(cfg: MCMCConfig):
    """Validate everything that needs no data and return the run's NUTS (:func:`nuts_of`): its options and prior (the
    method's rules), a toy or UCI dataset and its sizes, a small mlp without dropout, and no option that has no
    meaning for NUTS.

    Raises :class:`ValueError` naming the option. Run before anything is loaded or written.
    """
    mc = cfg.mcmc
    check_calibration(cfg)
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
    if cfg.data.val_size != 0:
        raise ValueError("--val-size does not apply to pyrobnn mcmc: it samples on every training point and "
                         "reports no validation metrics")
    if cfg.model.name.lower() not in MCMC_MODELS:
        raise ValueError(f"--model {cfg.model.name}: pyrobnn mcmc samples small networks, --model "
                         f"{' or '.join(MCMC_MODELS)} with a few narrow --hidden layers")
    for width in cfg.model.hidden:
        positive_int("--hidden", width)
    if cfg.model.bayesian == "none":
        raise ValueError("--bayesian none leaves no weights for NUTS to sample")
    nuts = nuts_of(cfg)
    try:
        nuts.check(epochs=1, rows=cfg.data.train_size)
    except Refused as refusal:
        raise ValueError(spelled(refusal, "mcmc")) from None
    defaults = LikelihoodOptions()
    for name in ("learn_scale", "vdp_objective"):
        if getattr(cfg.likelihood, name) != getattr(defaults, name):
            raise ValueError(f"{flag('likelihood', name, True)} does not apply to pyrobnn mcmc: NUTS samples "
                             "the weights and holds the likelihood fixed")
    if cfg.likelihood.name != "auto":
        make_likelihood(cfg, None)
    return nuts


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
        return GuideRateOptim(opt.optimizer, lr, opt.weight_decay, schedule=schedule, kl_lr=opt.kl_lr,
                              factor=positive("--variational-lr-factor", opt.variational_lr_factor))
    return Optim(opt.optimizer, lr, opt.weight_decay, schedule=schedule, kl_lr=opt.kl_lr)


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
