"""The CP mesh from torch's DeviceMesh, and the peer groups workloads communicate over."""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from cpbench.core import Topology, TopologyKind

# 2d dims are named as the fold-cp driver names them, so its modules find `mesh["cp0"]`: cp0 indexes
# the row blocks, cp1 the column blocks.
ROWS, COLS = "cp0", "cp1"


def build_mesh(topology: Topology, device_type: str) -> tuple[DeviceMesh, tuple[int, int], tuple]:
    """Return the mesh, this rank's (row block, column block) and its (row_peers, col_peers).

    1d is a one-axis mesh ("cp") of row slabs; 2d a (cp0, cp1) grid. `row_peers` vary the column
    block (they share token rows); `col_peers` vary the row block.
    """
    if topology.kind is TopologyKind.one_d:
        mesh = init_device_mesh(device_type, (topology.cp,), mesh_dim_names=("cp",))
        coords = (mesh.get_local_rank("cp"), 0)
        col_peers = mesh.get_group("cp") if topology.cp > 1 else None
        return mesh, coords, (None, col_peers)
    rows, cols = topology.grid
    mesh = init_device_mesh(device_type, (rows, cols), mesh_dim_names=(ROWS, COLS))
    coords = (mesh.get_local_rank(ROWS), mesh.get_local_rank(COLS))
    row_peers = mesh.get_group(COLS) if cols > 1 else None
    col_peers = mesh.get_group(ROWS) if rows > 1 else None
    return mesh, coords, (row_peers, col_peers)
