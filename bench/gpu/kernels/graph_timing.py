"""µs per call of GPU work captured in a CUDA graph: the timing of the few-row kernel benchmarks
(int8_linear.py, skinny_gemm.py, read_floor.py here; the retired skinny_gemm and weight_only_gemm
experiments used it too). The product's own (bass.kernels.timing), which the few-row planning uses
at model load. Imported by its neighbours as a plain module: run them as
`python bench/gpu/kernels/NAME.py`."""

from bass.kernels.timing import graph_us

__all__ = ["graph_us"]
