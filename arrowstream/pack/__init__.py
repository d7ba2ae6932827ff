"""Packing: the packer protocol and the strategies (concat, best fit, bucketing), batch assembly."""

from arrowstream.pack.base import Packer, PackRun
from arrowstream.pack.concat import ConcatPacker

__all__ = ["ConcatPacker", "PackRun", "Packer"]
