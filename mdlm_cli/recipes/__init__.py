"""Paper tables as recipes (`presets/tables/*.yaml`): which models to train, which commands to
run on them, and the paper's numbers; `mdlm reproduce` plans, runs and reports them."""

from .plan import Job, plan
from .report import report_rows
from .schema import Recipe, list_recipes, load_recipe
from .stand_in import parse_pairs, stand_in

__all__ = ["Job", "Recipe", "list_recipes", "load_recipe", "parse_pairs", "plan", "report_rows",
           "stand_in"]
