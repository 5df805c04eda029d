"""The settings each objective needs on top of the `test` preset (its config checks):
tests parametrised over OBJECTIVES build their configs with these."""

REQUIRED = {
    "sedd": ["model.time_conditioning=true"],
    "d3pm": ["diffusion.T=100", "diffusion.zero_masking=false", "diffusion.carry_over=false",
             "model.time_conditioning=true"],
    "bd3lm": ["diffusion.block_size=8"],
}


def overrides(name: str) -> list[str]:
    """`--set` assignments selecting objective `name` with a valid configuration."""
    return [f"diffusion.objective={name}", *REQUIRED.get(name, [])]
