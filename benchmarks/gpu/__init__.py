"""The GPU check (`make gpu-check`): kernel tests, decode bandwidth and end-to-end on CUDA."""
