"""Mixed precision as the models run it: fp32 weights, bf16 compute under autocast when asked."""

from __future__ import annotations

import torch


class MixedPrecision:
    """For an nn.Module whose `precision` is "fp32" or "bf16"."""

    precision: str

    def autocast(self) -> torch.autocast:
        """bf16 autocast without its weight cache: a cached bf16 copy of every weight would stay alive
        until the step ends (half the model's bytes again), and a weight cast when used is a
        transient; with the cache, which copies are alive at a step's peak depends on the order of
        the ops, which a memory estimate of a model with cut loops could not follow."""
        device_type = next(self.parameters()).device.type
        enabled = self.precision == "bf16"
        return torch.autocast(device_type, dtype=torch.bfloat16, enabled=enabled, cache_enabled=False)
