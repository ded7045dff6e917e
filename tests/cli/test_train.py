"""The training loop: exact resume from a checkpoint, divergence handling, input validation."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from pyrobnn import BayesianNetwork, NormalGuide
from pyrobnn.analysis.evaluate import Validation
from pyrobnn.checkpoint import load_checkpoint
from pyrobnn.data import load_dataset, two_moons
from pyrobnn.infer.elbo import MeanFieldELBO
from pyrobnn.infer.optim import Optim, StepDecay
from pyrobnn.infer.svi import Checkpoint, TrainingDiverged, fit
from pyrobnn.networks import build_net

FIT = dict(batch_size=32, elbo=MeanFieldELBO(2, vectorize_particles=True, estimator="sample"), optimizer=Optim(lr=1e-2),
           seed=0, device="cpu", progress=False)


@pytest.fixture(scope="module")
def moons():
    return two_moons(n=400, n_train=200, seed=1)


def make_run(input_shape=None):
    """A fresh tiny MLP (same initial weights every time) with its guide."""
    torch.manual_seed(1234)
    net = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 2))
    model = BayesianNetwork(net, num_data=200, input_shape=input_shape)
    return model, NormalGuide(model, init_rho=-4.0)


# ----------------------------------------------------------------------------- resume


@pytest.mark.parametrize("extra", ["adam", "sgd+lr_step+val"])
def test_resume_from_checkpoint_continues_exactly(moons, tmp_path, extra):
    x, y = moons.x_train, moons.y_train
    options = dict(FIT)
    if extra != "adam":
        # validation draws posterior samples between epochs (RNG), the lr schedule and SGD momentum
        # are state of their own: all must be restored
        # per example 2.0: 1e-2 on the loss, a sum over the N = 200 examples (the history records 2.0)
        options.update(optimizer=Optim("sgd", lr=2.0, schedule=StepDecay(1, 0.5)))

    def validation():
        return [Validation(moons.x_test[:50], moons.y_test[:50], num_samples=3)] if extra != "adam" else []

    model, guide = make_run()
    full = fit(model, guide, x, y, epochs=4, on_epoch_end=validation(), **options)

    path = tmp_path / "ckpt" / "checkpoint.pt"
    model1, guide1 = make_run()
    first = fit(model1, guide1, x, y, epochs=2, checkpoint=path, on_epoch_end=validation(), **options)
    assert path.is_file()
    assert load_checkpoint(path)["epoch"] == 1
    assert first["loss"] == full["loss"][:2]

    model2, guide2 = make_run()  # a new process would start from here
    resumed = fit(model2, guide2, x, y, epochs=4, checkpoint=Checkpoint(path, resume=True), on_epoch_end=validation(),
                  **options)

    assert resumed["epoch"] == [1, 2, 3, 4]
    assert resumed["loss"] == full["loss"]
    assert resumed["nll"] == full["nll"] and resumed["kl"] == full["kl"]
    assert resumed["lr"] == full["lr"]
    if extra != "adam":
        assert full["lr"] == pytest.approx([2.0, 1.0, 0.5, 0.25])
        assert resumed["val_accuracy"] == full["val_accuracy"] and resumed["val_nll"] == full["val_nll"]
    expected, got = guide.state_dict(), guide2.state_dict()
    assert expected.keys() == got.keys()
    for key in expected:
        assert torch.equal(expected[key], got[key]), key
    assert load_checkpoint(path)["epoch"] == 3
    # training did something: the loss went down and the parameters moved
    assert full["loss"][-1] < full["loss"][0]
    assert not torch.equal(guide1.state_dict()[key], got[key])


def test_resume_without_checkpoint_file_starts_from_scratch(moons, tmp_path):
    path = tmp_path / "fresh.pt"
    model, guide = make_run()
    history = fit(model, guide, moons.x_train, moons.y_train, epochs=1, checkpoint=Checkpoint(path, resume=True), **FIT)
    assert history["epoch"] == [1] and path.is_file()
    state = load_checkpoint(path)
    assert set(state) >= {"model", "guide", "optimizer", "scheduler", "epoch", "history", "rng", "config"}


@pytest.mark.parametrize("every, writes", [(0.0, [0, 1, 2, 3]), (3600.0, [3])])
def test_checkpoint_every_sets_how_often_the_checkpoint_is_written(moons, tmp_path, monkeypatch, every, writes):
    """0 writes after every epoch; a long interval writes once, after the last epoch, the same state."""
    import pyrobnn.infer.svi as svi

    written = []
    save = svi.save_checkpoint
    monkeypatch.setattr(svi, "save_checkpoint", lambda path, state: (written.append(state["epoch"]), save(path, state)))
    path = tmp_path / "checkpoint.pt"
    model, guide = make_run()
    fit(model, guide, moons.x_train, moons.y_train, epochs=4, checkpoint=Checkpoint(path, every=every), **FIT)
    assert written == writes
    state = load_checkpoint(path)
    assert state["epoch"] == 3 and len(state["history"]) == 4
    for key, value in guide.state_dict().items():
        assert torch.equal(state["guide"][key], value), key


@pytest.mark.parametrize("stop", [KeyboardInterrupt, RuntimeError])
def test_a_run_stopped_between_writes_keeps_its_last_completed_epoch(moons, tmp_path, stop):
    """With the checkpoint waiting in memory, an interruption writes the last completed epoch's state, as it was
    then (the steps after it do not leak into it), and a resumed run continues exactly."""
    path = tmp_path / "checkpoint.pt"
    kept = {}

    def interrupt(epoch, record):
        if epoch == 1:
            kept.update({k: v.clone() for k, v in guide.state_dict().items()})
        if epoch == 2:
            raise stop("stopped")

    model, guide = make_run()
    with pytest.raises(stop):
        fit(model, guide, moons.x_train, moons.y_train, epochs=4, checkpoint=Checkpoint(path, every=3600.0),
            on_epoch_end=interrupt, **FIT)
    state = load_checkpoint(path)
    assert state["epoch"] == 1 and len(state["history"]) == 2
    for key, value in kept.items():
        assert torch.equal(state["guide"][key], value), key
        assert not torch.equal(guide.state_dict()[key], value), key  # epoch 3 trained on after it

    model_full, guide_full = make_run()
    full = fit(model_full, guide_full, moons.x_train, moons.y_train, epochs=4, **FIT)
    model2, guide2 = make_run()
    resumed = fit(model2, guide2, moons.x_train, moons.y_train, epochs=4, checkpoint=Checkpoint(path, resume=True),
                  **FIT)
    assert resumed["loss"] == full["loss"]


def test_checkpoint_every_must_be_nonnegative(moons, tmp_path):
    model, guide = make_run()
    with pytest.raises(ValueError, match="checkpoint every"):
        fit(model, guide, moons.x_train, moons.y_train, epochs=1, checkpoint=Checkpoint(tmp_path / "c.pt", every=-1),
            **FIT)
    assert not (tmp_path / "c.pt").exists()


# ----------------------------------------------------------------------------- divergence


def test_nan_loss_raises_and_keeps_last_good_checkpoint(moons, tmp_path):
    path = tmp_path / "checkpoint.pt"
    model, guide = make_run()
    fit(model, guide, moons.x_train, moons.y_train, epochs=1, checkpoint=path, **FIT)
    good = {k: v.clone() for k, v in guide.state_dict().items()}
    assert load_checkpoint(path)["epoch"] == 0

    model2, guide2 = make_run()
    x_nan = torch.full_like(moons.x_train, float("nan"))
    with pytest.raises(TrainingDiverged, match=r"epoch 2") as info:
        fit(model2, guide2, x_nan, moons.y_train, epochs=2, checkpoint=Checkpoint(path, resume=True), **FIT)
    message = str(info.value)
    assert "nan" in message.lower() and str(path) in message

    state = load_checkpoint(path)
    assert state["epoch"] == 0
    assert len(state["history"]) == 1 and math.isfinite(state["history"][0]["loss"])
    for key, value in good.items():
        assert torch.equal(state["guide"][key], value), key


def test_divergence_in_the_middle_of_a_run(moons, tmp_path):
    """Inputs that become NaN after the first epoch: stop at epoch 2, checkpoint of epoch 1 kept."""
    path = tmp_path / "run" / "checkpoint.pt"
    x = moons.x_train.clone()
    seen = []

    def poison(epoch, record):
        seen.append(epoch)
        if epoch == 0:
            x.fill_(float("nan"))

    model, guide = make_run()
    with pytest.raises(TrainingDiverged, match=r"epoch 2, step 1"):
        fit(model, guide, x, moons.y_train, epochs=3, checkpoint=path, on_epoch_end=poison, **FIT)
    assert seen == [0]
    state = load_checkpoint(path)
    assert state["epoch"] == 0
    model2, guide2 = make_run()
    guide2.load_state_dict(state["guide"])  # loadable into a fresh guide
    assert all(torch.isfinite(v).all() for v in guide2.state_dict().values())


def test_huge_learning_rate_diverges_with_clear_error(moons):
    model, guide = make_run()
    # one Adam step moves every mean by ~lr: mu^2 in the KL overflows float32 on the next step
    with pytest.raises(TrainingDiverged, match=r"loss became (inf|nan) at epoch 1, step 2 .*lr=1e\+30"):
        fit(model, guide, moons.x_train, moons.y_train, epochs=2, **{**FIT, "optimizer": Optim(lr=1e30)})


# ----------------------------------------------------------------------------- bad inputs


def test_wrong_input_shape(moons):
    model, guide = make_run(input_shape=(2,))
    x = torch.randn(20, 3)
    y = torch.zeros(20, dtype=torch.long)
    with pytest.raises(ValueError, match=r"shape \(3,\).*\(2,\)"):
        fit(model, guide, x, y, epochs=1, **FIT)
    with pytest.raises(ValueError, match="shape"):
        model(x, y)
    with pytest.raises(ValueError, match="shape"):
        fit(model, guide, moons.x_train, moons.y_train, epochs=1, on_epoch_end=Validation(x, y), **FIT)


def test_input_that_does_not_fit_the_network_without_input_shape():
    model, guide = make_run()
    with pytest.raises(ValueError, match="does not fit the network"):
        model(torch.randn(4, 5), torch.zeros(4, dtype=torch.long))


@pytest.mark.parametrize("bad, match", [(2, "label 2 is out of range"), (-1, "label -1 is out of range")])
def test_labels_out_of_range(moons, bad, match):
    model, guide = make_run()
    y = moons.y_train.clone()
    y[5] = bad
    with pytest.raises(ValueError, match=match):
        fit(model, guide, moons.x_train, y, epochs=1, **FIT)


def test_float_labels_and_length_mismatch(moons):
    model, guide = make_run()
    with pytest.raises(ValueError, match="integer"):
        fit(model, guide, moons.x_train, moons.y_train.float(), epochs=1, **FIT)
    with pytest.raises(ValueError, match="200 examples but y has 199"):
        fit(model, guide, moons.x_train, moons.y_train[:-1], epochs=1, **FIT)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(batch_size=0), "batch_size"),
        (dict(epochs=0), "epochs"),
        (dict(epochs=-2), "epochs"),
        (dict(compile="fast"), "compile"),
        (dict(checkpoint=Checkpoint("run.pt", every=-1)), "every"),
        (dict(device="tpu"), "device"),
    ],
)
def test_invalid_fit_arguments(moons, kwargs, match):
    model, guide = make_run()
    with pytest.raises(ValueError, match=match):
        fit(model, guide, moons.x_train, moons.y_train, **{**FIT, "epochs": 1, **kwargs})


@pytest.mark.parametrize("kwargs, match", [(dict(num_particles=0), "num_particles"),
                                           (dict(estimator="sampling"), "estimator"),
                                           (dict(precision="fp16"), "precision"),
                                           (dict(num_particles=2, estimator="vdp"), "deterministically")])
def test_invalid_objectives(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MeanFieldELBO(**kwargs)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: Optim(lr=0.0), "lr"),
        (lambda: Optim(lr=float("nan")), "lr"),
        (lambda: Optim("rmsprop"), "optimizer"),
        (lambda: Optim(warmup_steps=-1), "warmup_steps"),
        (lambda: Optim(schedule=0.5), "schedule"),
        (lambda: StepDecay(-1), "step"),
        (lambda: StepDecay(1, 0.0), "gamma"),
    ],
)
def test_invalid_optimizer_arguments(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


def test_fit_refuses_an_optimizer_that_is_not_a_factory(moons):
    with pytest.raises(TypeError, match="optimizer factory"):
        fit(*make_run(), moons.x_train, moons.y_train, **{**FIT, "epochs": 1, "optimizer": "sgd"})


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cuda_requested_without_cuda(moons):
    model, guide = make_run()
    with pytest.raises(ValueError, match="CUDA is not available"):
        fit(model, guide, moons.x_train, moons.y_train, **{**FIT, "epochs": 1, "device": "cuda"})


def test_unknown_dataset():
    with pytest.raises(ValueError, match="unknown dataset 'imagenet'"):
        load_dataset("imagenet")


def test_unknown_model():
    with pytest.raises(ValueError, match="unknown network 'resnet9000'"):
        build_net("resnet9000", (1, 28, 28), 10)
    with pytest.raises(ValueError, match="unknown torchvision model 'notamodel'"):
        build_net("tv:notamodel", (3, 32, 32), 10)


def test_missing_data_root(tmp_path):
    root = tmp_path / "no-such-dir"
    with pytest.raises(FileNotFoundError) as info:
        load_dataset("mnist", root, download=False)
    message = str(info.value)
    assert str(root) in message and "--data-root" in message and "PYROBNN_DATA" in message
    assert not root.exists()  # nothing created next to the requested root


def test_deterministic_baseline_trains_through_the_same_loop(moons):
    torch.manual_seed(1234)
    net = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 2))
    model = BayesianNetwork(net, num_data=200, deterministic=True)
    guide = NormalGuide(model)
    assert model.sites() == [] and list(guide.parameters()) == []
    history = fit(model, guide, moons.x_train, moons.y_train, epochs=3,
                  **{**FIT, "elbo": MeanFieldELBO(estimator="sample")})
    assert history["kl"] == [0.0, 0.0, 0.0]
    assert history["loss"][-1] < history["loss"][0]
    assert history["loss"] == pytest.approx(history["nll"])


# ----------------------------------------------------------------------------- BatchNorm networks


def test_fit_network_with_batchnorm1d(moons):
    """A BatchNorm1d network (deterministic BN, Bayesian Linear layers) trains with fit."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(2, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))
    model = BayesianNetwork(net, num_data=200)
    guide = NormalGuide(model, init_rho=-4.0)
    history = fit(model, guide, moons.x_train, moons.y_train, epochs=2, **FIT)
    assert len(history.epochs) == 2 and all(math.isfinite(v) for v in history["loss"])


def test_fit_updates_batchnorm_statistics_only_in_training_steps():
    """Running statistics of (e.g. pretrained) BatchNorm layers move once per training forward pass,
    never on an input-validation pass with a single example and prior weights."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.ReLU(), nn.Flatten(), nn.Linear(2 * 6 * 6, 2))
    model = BayesianNetwork(net, num_data=16)
    guide = NormalGuide(model, init_rho=-4.0)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 1, 8, 8, generator=g), torch.randint(0, 2, (16,), generator=g)
    bn = model.net[1]
    assert bn.num_batches_tracked.item() == 0
    fit(model, guide, x, y, epochs=1, **{**FIT, "batch_size": 16, "elbo": MeanFieldELBO(estimator="sample")})
    # one epoch of one minibatch with one particle = exactly one training forward pass
    assert bn.num_batches_tracked.item() == 1


# ----------------------------------------------------------------------------- options of fit


def test_transform_is_applied_to_every_training_batch_and_the_data_check(moons):
    model, guide = make_run()
    seen = []

    def halve(xb):  # data stored at twice its scale, e.g. uint8 images turned to floats per batch
        seen.append(xb.shape[0])
        return xb / 2

    history = fit(model, guide, moons.x_train * 2, moons.y_train, epochs=1, transform=halve, **FIT)
    assert seen == [1] + [32] * 6 + [8]  # the check of the first example, then 7 batches of 200
    model2, guide2 = make_run()
    same = fit(model2, guide2, moons.x_train, moons.y_train, epochs=1, **FIT)
    assert history.last["loss"] == pytest.approx(same.last["loss"], rel=1e-5)


def test_optimizer_factory_and_lr_schedule_per_group(moons):
    model, guide = make_run()

    def groups(model, guide):
        locs = [p for n, p in guide.named_parameters() if ".locs." in n or n.startswith("locs")]
        rest = [p for p in guide.parameters() if all(p is not q for q in locs)]
        return torch.optim.SGD([{"params": locs, "lr": 0.1}, {"params": rest, "lr": 0.01}], lr=0.1)

    groups.schedule = [lambda e: 0.5 ** e, lambda e: 1.0]  # any factory may carry its schedule
    history = fit(model, guide, moons.x_train, moons.y_train, epochs=3, **{**FIT, "optimizer": groups})
    assert history["lr"] == pytest.approx([0.1, 0.05, 0.025])  # the lr each epoch trained with
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        fit(model, guide, moons.x_train, moons.y_train, epochs=1, **{**FIT, "optimizer": lambda m, g: None})


def test_num_data_scales_the_likelihood(moons):
    model, guide = make_run()
    fit(model, guide, moons.x_train, moons.y_train, epochs=1, num_data=800, **FIT)
    assert model.num_data == 800
    with pytest.raises(ValueError, match="num_data"):
        fit(model, guide, moons.x_train, moons.y_train, epochs=1, num_data=10, **FIT)


def test_bf16_autocast_keeps_the_loss_close_and_the_kl_in_fp32(moons):
    losses = {}
    for precision in ("fp32", "bf16"):
        model, guide = make_run()
        elbo = MeanFieldELBO(2, vectorize_particles=True, estimator="sample", precision=precision)
        losses[precision] = fit(model, guide, moons.x_train, moons.y_train, epochs=2,
                                **{**FIT, "elbo": elbo}).last["loss"]
        assert all(p.dtype == torch.float32 for p in guide.parameters())
    assert losses["bf16"] == pytest.approx(losses["fp32"], rel=0.05)
    with pytest.raises(ValueError, match="precision"):
        MeanFieldELBO(estimator="sample", precision="fp16")


def test_warmup_ramps_the_rate_per_step_and_leaves_the_epoch_schedule_alone(moons):
    seen = []

    class RecordingSGD(torch.optim.SGD):
        def step(self, closure=None):
            seen.append(self.param_groups[0]["lr"])
            return super().step(closure)

    class Recording:
        schedule, warmup_steps = StepDecay(1, 0.5), 5

        def __call__(self, model, guide):
            return RecordingSGD(guide.parameters(), lr=0.08)

    model, guide = make_run()
    history = fit(model, guide, moons.x_train, moons.y_train, epochs=2,
                  **{**FIT, "batch_size": 50, "optimizer": Recording()})
    assert seen == pytest.approx([0.016, 0.032, 0.048, 0.064, 0.04, 0.04, 0.04, 0.04])  # 4 steps per epoch
    assert history["lr"] == pytest.approx([0.08, 0.04])
    Recording.warmup_steps = -1
    with pytest.raises(ValueError, match="warmup_steps"):
        fit(model, guide, moons.x_train, moons.y_train, epochs=1, **{**FIT, "optimizer": Recording()})
