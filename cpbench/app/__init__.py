"""The Hydra application's rooms: checks before anything starts, one run as a campaign over its
launcher, interrupts, and the jobs of a multirun. `cpbench/__main__.py` is the entry alone."""
