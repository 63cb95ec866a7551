"""The Hydra config tree, installed as the package cpbench.configs."""
