"""What a run is before it runs: its time budget (`budget.py`), how it differs from the real job it
stands for (`changes.py`), and the check that it leaves nothing behind (`footprint.py`)."""
