"""The AlphaFold3 trunk and diffusion sampler with one-rank, 1d and 2d context parallelism (docs/fold.md)."""
