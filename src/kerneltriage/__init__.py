"""kerneltriage: ask the three questions before writing a GPU kernel, and measure the answers."""

__version__ = "0.1.0"
