"""Hand-written GPU kernels (Triton), each with a pure-torch fallback for CPU and CI."""

from .softcap_ce import available as softcap_ce_available
from .softcap_ce import softcap_cross_entropy, softcap_cross_entropy_reference

__all__ = ["softcap_cross_entropy", "softcap_cross_entropy_reference", "softcap_ce_available"]
