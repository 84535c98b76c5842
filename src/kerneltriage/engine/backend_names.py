"""The backends by name, each with the module that holds its `BACKEND`: one list, from which `--backend`, the lever
table's backends (levers.BOTH) and the backend peers derive. `engine/backend.py` imports a backend's module on
first use, so naming one loads no framework; this file imports nothing, so the lever table can read it without
reaching the backend protocol (which reads the lever table's `Place`)."""

BACKENDS = {"torch": "kerneltriage.backends.torch.backend", "mlx": "kerneltriage.backends.mlx.backend"}
