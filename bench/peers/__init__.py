"""memfit beside the real peer libraries, one module per comparison (fit,
lazy, explain, estimate) and their shared helpers (common). bench/peers.py
runs them; this folder has no script of its own, so bench/run_all.py, which
runs bench/*.py, does not run it twice."""
