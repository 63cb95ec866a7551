"""Checks of a run: its answers against the cp=1 run of the same config (mode=accuracy), against itself
run again (repeat_check) and against the rules (compliance); its convergence curve's reference; and that
it leaves nothing behind (footprint)."""
