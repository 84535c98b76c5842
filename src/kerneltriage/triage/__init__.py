"""The three questions as analyzers that return Findings, and `run.py` that asks them in order."""
