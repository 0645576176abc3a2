"""What each ggml backend is: buffer types and their alignment (``buffers``), the devices llama.cpp can place
work on (``devices``), which ops and weights a device takes (``loader_ops``), the CPU's extra buffer types
(``cpu_repack``, ``cpu_amx``) and CUDA's allocation, op support and fusion rules (``cuda_*``)."""
