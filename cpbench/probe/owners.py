"""Who holds a traced peak: the live bytes at a fake-tensor trace's peak, by the module whose forward
allocated them, so that a report can name what limits N rather than only how much."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn
from torch.nn.modules import module as module_hooks

OUTSIDE = "(inputs and glue)"  # allocated outside any module's forward: the batch, the step's own ops
WEIGHTS = "(weights)"
BACKWARD = "(backward)"  # autograd runs no module hooks: its gradients are counted here
_INDEX = re.compile(r"\.\d+(?=\.|$)")


class ModuleStack:
    """The module whose forward runs now, by its name in `model` with block indices folded
    (`pairformer.blocks.*.tri_att_start`): every block of a stack holds the same at its peak."""

    def __init__(self, model: nn.Module):
        self._names = {id(m): _INDEX.sub(".*", name) for name, m in model.named_modules() if name}
        self._stack: list[str] = []

    @property
    def current(self) -> str:
        return self._stack[-1] if self._stack else OUTSIDE

    @contextmanager
    def hooked(self) -> Iterator[ModuleStack]:
        """The stack kept by global forward hooks (every module; unnamed ones keep their parent's name)."""

        def enter(module: nn.Module, _args: object) -> None:
            self._stack.append(self._names.get(id(module), self.current))

        def leave(_module: nn.Module, _args: object, _out: object) -> None:
            self._stack.pop()

        handles = (
            module_hooks.register_module_forward_pre_hook(enter),
            module_hooks.register_module_forward_hook(leave, always_call=True),
        )
        try:
            yield self
        finally:
            for handle in handles:
                handle.remove()


def top_owners(live: dict[str, int], count: int = 3) -> list[tuple[str, int]]:
    """The `count` largest holders, largest first; the rest summed as one."""
    ranked = sorted(live.items(), key=lambda kv: kv[1], reverse=True)
    head, rest = ranked[:count], sum(b for _, b in ranked[count:])
    return head + ([("(the rest)", rest)] if rest else [])
