"""``rsplan estimate``'s per-device breakdown of one run (``breakdown``)."""
