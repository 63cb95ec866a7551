"""What a run records about itself while it runs: its metadata (host, devices, versions, the GPU's
state through NVML) and its MLPerf log. The report renders these records; it does not make them."""
