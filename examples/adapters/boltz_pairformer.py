"""Boltz-2's Pairformer trunk (`boltz.model.layers.pairformer.PairformerModule`, from PyPI) as a
cpbench adapter module in the fold-cp style: the original driver's three hooks, with the keywords
cpbench adds (`options`, `ctx`, `features`). docs/adapters.md walks through it.

boltz pins numpy<2 and a torch of its own, so install it without its dependencies, plus the two its
layers import (einops; scipy for the weights' initialisation):

    pip install --no-deps boltz && pip install einops scipy
    python -m cpbench workload=adapter workload.module=examples.adapters.boltz_pairformer \\
        workload.options_file=examples/adapters/boltz_pairformer.yaml topology.kind=2d topology.cp=1

The layer holds the whole pair tensor, so it runs at cp=1 (the fold-cp contract's 1x1 mesh).
"""

from __future__ import annotations

from typing import Any

import torch
from boltz.model.layers.pairformer import PairformerModule

# Boltz-2's trunk as it predicts (its published model's sizes); each names the option that sets it,
# so the what-changed table compares it with what the run sets.
REAL_JOB = {
    "Pairformer blocks": {"option": "blocks", "real": 64},
    "single channels (token_s)": {"option": "token_s", "real": 384},
    "pair channels (token_z)": {"option": "token_z", "real": 128},
    "single attention heads": {"option": "heads", "real": 16},
    "triangle attention heads": {"option": "pair_heads", "real": 4},
    "triangle attention head width": {"option": "pair_head_width", "real": 32},
    "recycling passes through the trunk": {"real": 4, "benchmark": 1, "why": "each pass costs the same"},
}


class Trunk(torch.nn.Module):
    """Boltz's Pairformer behind a linear input projection of each track, standing in for its input
    embedder: the layers' inputs require grad, as in Boltz, which its (reentrant) checkpointing needs."""

    def __init__(self, options: dict[str, Any]):
        super().__init__()
        token_s, token_z = options["token_s"], options["token_z"]
        self.kernels = options["kernels"]  # cuequivariance's fused triangle kernels (CUDA only)
        self.s_in, self.z_in = torch.nn.Linear(token_s, token_s), torch.nn.Linear(token_z, token_z)
        self.pairformer = PairformerModule(
            token_s, token_z, options["blocks"], num_heads=options["heads"], dropout=options["dropout"],
            pairwise_head_width=options["pair_head_width"], pairwise_num_heads=options["pair_heads"],
            activation_checkpointing=options["checkpointing"], v2=True,
        )  # fmt: skip

    def forward(self, s: torch.Tensor, z: torch.Tensor, mask: torch.Tensor, pair_mask: torch.Tensor) -> Any:
        return self.pairformer(self.s_in(s), self.z_in(z), mask, pair_mask, use_kernels=self.kernels)


def build_model(mesh: Any, device: torch.device, *, options: dict[str, Any]) -> torch.nn.Module:
    if mesh.size() != 1:
        raise ValueError(
            f"boltz_pairformer holds the whole pair tensor: run it at topology.cp=1, not {mesh.size()}"
        )
    model = Trunk(options).to(device)  # the driver seeded torch: the same weights for one seed
    model.optimizer = torch.optim.AdamW(model.parameters(), lr=options["lr"])  # the module owns its step
    return model


def build_batch(
    N: int, n_atoms: int, S: int, mesh: Any, device: torch.device, *, options: dict[str, Any],
    features: dict[str, torch.Tensor] | None,
) -> dict[str, torch.Tensor]:  # fmt: skip
    """The trunk's inputs: single and pair embeddings, token and pair masks. From a feature file the
    masks are the input's and the embeddings start from its residue types and relative positions (a
    fixed random projection stands in for Boltz's input embedder); otherwise random, as the driver seeds."""
    token_s, token_z = options["token_s"], options["token_z"]
    if features is None:
        s, z = torch.randn(1, N, token_s), torch.randn(1, N, N, token_z)
        mask = torch.ones(1, N)
    else:
        res_type = torch.nn.functional.one_hot(features["res_type"], 33).float()
        s = (res_type @ torch.randn(33, token_s))[None]
        offset = (features["residue_index"][:, None] - features["residue_index"][None, :]).clamp(-32, 32) + 32
        same_chain = features["asym_id"][:, None] == features["asym_id"][None, :]
        bins = torch.where(same_chain, offset, torch.full_like(offset, 65))  # 65: another chain
        z = torch.nn.functional.embedding(bins, torch.randn(66, token_z))[None]
        mask = features["token_pad_mask"].float()[None]
    batch = {"s": s, "z": z, "mask": mask, "pair_mask": mask[:, :, None] * mask[:, None, :]}
    return {name: value.to(device) for name, value in batch.items()}


def run_step(model: torch.nn.Module, batch: dict[str, torch.Tensor], train: bool) -> Any:
    """Inference: the trunk's forward (Boltz chunks triangle attention in eval mode); training: forward,
    backward of a stand-in loss and the module's own AdamW step."""
    model.train(train)
    if not train:
        with torch.no_grad():
            return model(**batch)
    s, z = model(**batch)
    loss = s.float().pow(2).mean() + z.float().pow(2).mean()
    loss.backward()
    model.optimizer.step()
    model.optimizer.zero_grad(set_to_none=True)
    return loss.detach()
