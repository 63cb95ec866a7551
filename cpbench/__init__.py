"""cpbench: a benchmark driver for context-parallel structure models."""

import os

# Large CPU tensors in transparent huge pages (torch's allocator reads this at its first allocation, so
# it is set here, before torch is imported; ranks inherit it). Under the CPU cap every large tensor is
# its own mmap, returned to the OS when freed (cpbench/measure/cap.py), so each new one faults its
# pages in afresh: 2 MiB pages take far fewer faults (docs/probe.md, benchmarks/huge_pages.py). An
# environment that sets it keeps its own value.
HUGE_PAGES = "THP_MEM_ALLOC_ENABLE"
os.environ.setdefault(HUGE_PAGES, "1")
