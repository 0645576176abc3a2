"""llama.cpp's ``--fit``: its steps (``steps``), one start's memory per device (``memory``), the MTP draft
(``draft``) and one ``rsplan fit`` answer (``run``)."""
