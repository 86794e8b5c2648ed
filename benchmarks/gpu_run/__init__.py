"""The parts of `benchmarks/gpu.py` (the GPU run, `benchmarks/gpu.sh`): the models it makes
and exports (models.py), the cases it times (cases.py), and its report (report.py)."""
