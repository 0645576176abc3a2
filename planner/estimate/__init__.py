"""``rsplan estimate``'s per-device breakdown of one run (``breakdown``) and the buffer lines llama.cpp prints at its
load (``load_log``)."""
