"""The original loaderx 0.9's home of its writers (``from loaderx.converter
import from_numpy, from_iterator``), kept so its scripts run unchanged: the
same functions as ``loaderx.from_numpy`` / ``loaderx.from_iterator``
(loaderx.dataset). loaderx's own converters of other formats are
``loaderx.converters`` (``loaderx.convert``)."""
from __future__ import annotations

from .dataset import from_iterator, from_numpy

__all__ = ["from_numpy", "from_iterator"]
