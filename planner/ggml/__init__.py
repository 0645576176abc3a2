"""The ggml core, mirrored from its C source: tensor shapes and views (``ops``, ggml.c) and the graph allocator
(``alloc``, ggml-alloc.c) that turns a graph into a buffer size. Knows nothing of models or devices."""
