"""The compute buffers: the reserve graphs a context builds (``reserve``, with the per-family builders in
``graphs``), the backend scheduler that splits them over devices (``sched``) and each device's buffer
(``per_device``). ``reuse`` holds what makes repeated sizings fast (graphs kept across contexts, affine fits
over the KV size, layer periods); the mirror does not depend on it."""
