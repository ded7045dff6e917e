"""Between two tutorials: an empty Pyro parameter store and the same seed, so each runs as it would alone."""


def reset(gallery_conf, fname):
    import pyro

    pyro.clear_param_store()
    pyro.set_rng_seed(0)
