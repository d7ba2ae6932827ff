"""arrowstream: resumable, vectorized Parquet-to-token-batch loading for language-model training.

Start with :func:`read_parquet`, chain ``.filter``, ``.tokenize`` and ``.pack``,
and iterate. Every iterator has ``state_dict()`` / ``load_state_dict()``.
:func:`analyze` shows the data's lengths and what each batching strategy costs.
"""

import typing as _typing

from arrowstream.checkpoint import load_state, save_state
from arrowstream.core.stage import Stage
from arrowstream.errors import (
    ArrowStreamError,
    CacheError,
    CacheWarning,
    ConfigError,
    DataLossWarning,
    EncoderFallbackWarning,
    PerformanceWarning,
    SchemaError,
    ShardError,
    StateError,
    StateMismatchError,
)
from arrowstream.filter import Filter
from arrowstream.io.chunk import Chunk
from arrowstream.io.manifest import Manifest, Shard, read_manifest
from arrowstream.io.manifest_file import merge_manifests, write_manifest
from arrowstream.mixture import Mixture, MixtureIterator, PackedMixture, mix
from arrowstream.mixture.merge import merge_states
from arrowstream.pack import ConcatPacker, Packer
from arrowstream.pack.bestfit import BestFitPacker
from arrowstream.pack.bucket import BucketPacker
from arrowstream.pipeline.dataset import Dataset, read_parquet
from arrowstream.pipeline.indexing import build_length_index
from arrowstream.pipeline.iterator import DatasetIterator
from arrowstream.tokenize import Tokenize
from arrowstream.tokenize.encoders import Encoder

__all__ = [
    "Analysis",
    "ArrowStreamError",
    "BestFitPacker",
    "BucketPacker",
    "CacheError",
    "CacheWarning",
    "Chunk",
    "ConcatPacker",
    "ConfigError",
    "DataLossWarning",
    "Dataset",
    "DatasetIterator",
    "Encoder",
    "EncoderFallbackWarning",
    "Filter",
    "Manifest",
    "Mixture",
    "MixtureIterator",
    "PackedMixture",
    "Packer",
    "PerformanceWarning",
    "SchemaError",
    "Shard",
    "ShardError",
    "Stage",
    "StateError",
    "StateMismatchError",
    "Tokenize",
    "analyze",
    "build_length_index",
    "load_state",
    "merge_manifests",
    "merge_states",
    "mix",
    "read_manifest",
    "read_parquet",
    "save_state",
    "write_manifest",
]

__version__ = "0.1.0"

if _typing.TYPE_CHECKING:
    from arrowstream.analysis import Analysis, analyze


def __getattr__(name: str) -> _typing.Any:
    # The analysis (polars, the report) loads on first use: a training job never pays for it.
    if name in ("Analysis", "analyze"):
        from arrowstream import analysis

        return getattr(analysis, name)
    raise AttributeError(f"module 'arrowstream' has no attribute {name!r}")
