"""Models: the catalogue, config.json reading, and capture of the ops a model runs (TP sharding
included) from the module tree transformers builds."""
from . import capture
from .capture import Captured, OpInstance
from .catalogue import CATALOGUE

__all__ = ["CATALOGUE", "Captured", "OpInstance", "capture"]
