"""The core vocabulary every layer speaks: topology and its block arithmetic, shapes, the rank
context. It sits at the bottom of the package and imports nothing of cpbench."""

from cpbench.core.context import RankContext
from cpbench.core.errors import ConfigError, DoesNotFit
from cpbench.core.shape import Shape
from cpbench.core.topology import Tiling, Topology, TopologyKind

__all__ = ["ConfigError", "DoesNotFit", "RankContext", "Shape", "Tiling", "Topology", "TopologyKind"]
