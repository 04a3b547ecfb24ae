"""Models: the catalogue, config.json reading, and capture of the ops a model runs (TP sharding
included) from the module tree transformers builds."""
from lzsolve.models import capture
from lzsolve.models.capture import Captured, OpInstance
from lzsolve.models.catalogue import CATALOGUE

__all__ = ["CATALOGUE", "Captured", "OpInstance", "capture"]
