"""What makes repeated compute-buffer sizings fast, apart from the mirror: graphs built once per context shape
and sized at each context (``kept_shapes``), byte counts affine in the KV size (``kv_affine``) and graphs built over
fewer layers where layers repeat (``layer_periods``). Every answer equals the mirror's own, run without them."""
