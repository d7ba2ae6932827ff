"""Packing: the packer protocol and the strategies (concat, best fit, bucketing), batch assembly."""

from arrowstream.pack.base import ConcatPacker, Packer, PackRun

__all__ = ["ConcatPacker", "PackRun", "Packer"]
