"""The model's weights: llama-quantize's type per tensor (``quant``, applying ``quant_ftypes``, ``quant_inputs``,
``quant_allowed`` and ``quant_mixture``; ``quant_weights``), the weights counted when none are given
(``default_weights``), llama.cpp's layer split (``placement``), which buffer each tensor lands in
(``weight_placement``, ``host_weights``, ``host_charge``) and ``-ot`` written short (``override_compact``)."""
