"""The original loaderx 1.7's home of `train_dict` (``from loaderx.utils
import train_dict``), kept so its scripts run unchanged: the same function as
``loaderx.train_dict`` (loaderx.dictionary), which also takes 1.7's
``tier=None`` (the default tier) and ``path=`` (write the dictionary to a
file)."""
from __future__ import annotations

from .dictionary import DICT_TIERS, train_dict

__all__ = ["train_dict", "DICT_TIERS"]
