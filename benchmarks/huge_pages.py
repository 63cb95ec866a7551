"""The page-fault churn of the CPU cap, with and without transparent huge pages.

    python benchmarks/huge_pages.py

Under the cap (cpbench/measure/budget.py) glibc serves every block of 1 MiB and more from its own
mmap and unmaps it when freed, so each new large tensor faults its pages in afresh. This loop makes
64 MiB temporaries (a [512, 512, 64] float32 tensor) as a fold step does, on one thread, in a fresh
process per setting (torch reads THP_MEM_ALLOC_ENABLE at its first allocation), and prints the wall,
user and system time and the minor page faults of the loop.
"""

from __future__ import annotations

import os
import subprocess
import sys

LOOP = """
import ctypes, resource, time, torch
libc = ctypes.CDLL(None)
libc.mallopt(-3, 1 << 20); libc.mallopt(-1, 1 << 20)  # the cap's M_MMAP_THRESHOLD, M_TRIM_THRESHOLD
torch.set_num_threads(1)
a = torch.randn(512, 512, 64)
t0, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
for _ in range(30):
    b = a * 2.0
    c = b + a
    del b, c
r1 = resource.getrusage(resource.RUSAGE_SELF)
print(f"wall {time.perf_counter() - t0:.2f} s, user {r1.ru_utime - r0.ru_utime:.2f} s, "
      f"sys {r1.ru_stime - r0.ru_stime:.2f} s, minor faults {r1.ru_minflt - r0.ru_minflt}")
"""


def main() -> None:
    for setting in ("0", "1"):
        env = {**os.environ, "THP_MEM_ALLOC_ENABLE": setting}
        cmd = [sys.executable, "-c", LOOP]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        print(f"THP_MEM_ALLOC_ENABLE={setting}: {out.stdout.strip()}")


if __name__ == "__main__":
    main()
