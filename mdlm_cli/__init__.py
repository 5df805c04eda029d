"""mdlm: masked diffusion language models (MDLM, Sahoo et al. 2024) with the
first-hitting sampler and float64 categorical sampling (Zheng et al. 2024)."""

__version__ = "0.1.0"
