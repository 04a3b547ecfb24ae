"""Models: the catalogue, Hugging Face config loading, TP sharding and the op walker."""
from . import capture
from .catalogue import CATALOGUE
from .spec import ModelSpec, from_catalogue, from_config_file, from_hf_config, shard
from .walker import OpInstance, required_features, unmodelled, walk

__all__ = ["CATALOGUE", "capture", "ModelSpec", "OpInstance", "from_catalogue", "from_config_file", "from_hf_config",
           "required_features", "shard", "unmodelled", "walk"]
