"""GGUF files (llama.cpp's format) imported as Hugging Face directories: the header read within bounds
(``header``), the config (``config``), the weights (``weights``) and the tokenizer (``tokenizer``) from it, and the
cached import stage that writes them (``importer``)."""
