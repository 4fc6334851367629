"""Quality of a quantization: perplexity on the WikiText-2 test text, and `quality.json`."""
