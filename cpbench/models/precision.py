"""Mixed precision as the models run it: fp32 weights, bf16 compute under autocast when asked."""

from __future__ import annotations

import torch


class MixedPrecision:
    """For an nn.Module whose `precision` is "fp32" or "bf16"."""

    precision: str

    def autocast(self) -> torch.autocast:
        device_type = next(self.parameters()).device.type
        return torch.autocast(device_type, dtype=torch.bfloat16, enabled=self.precision == "bf16")
