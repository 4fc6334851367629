"""quantload: choose a llama.cpp quantization and server size from measurements."""

__version__ = "0.1.0"
