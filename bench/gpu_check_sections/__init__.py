"""The sections of bench/gpu_check.py, one module each (the entry point and its flags stay there)."""
