"""What a run is before it runs: its time budget (`budget.py`) and how it differs from the real job it
stands for (`changes.py`)."""
