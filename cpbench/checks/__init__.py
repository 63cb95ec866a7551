"""Checks of a run's answers: against the cp=1 run of the same config (mode=accuracy) and against
itself, run again (repeat_check)."""
